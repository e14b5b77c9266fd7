"""A commit's wake-ups go to Redis in one round trip per server, and each sender still
gets its own results, its own errors, and its fallback when Redis is gone."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from redis.connection import AbstractConnection

from jobs import redis_round, relay

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.services


@pytest.fixture
def writes(monkeypatch) -> list[bytes]:
    """What every Redis client of this process writes to its socket, one entry a write."""
    sent: list[bytes] = []
    original = AbstractConnection.send_packed_command

    def send_packed_command(self, command, check_health=True):
        chunks = [command] if isinstance(command, bytes | str) else list(command)
        sent.append(b"".join(c if isinstance(c, bytes) else c.encode() for c in chunks))
        return original(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", send_packed_command)
    return sent


def test_sends_of_one_block_are_one_write_per_server(own_redis, writes) -> None:
    first = redis.Redis.from_url(own_redis.url, socket_timeout=5)
    second = redis.Redis.from_url(own_redis.url, socket_timeout=1)  # same server
    first.ping(), second.ping()  # connected: what follows writes only commands
    writes.clear()
    got: list[object] = []
    with redis_round.together():
        redis_round.send(first, [redis_round.command("lpush", "queue", "a")], got.append)
        with redis_round.together():  # an inner block adds to the outer one's round
            redis_round.send(
                second,
                [
                    redis_round.command("set", "flag", 1, nx=True),
                    redis_round.command("set", "flag", 2, nx=True),
                ],
                got.append,
            )
        assert writes == []  # nothing before the block ends
    assert len(writes) == 1
    assert writes[0].index(b"LPUSH") < writes[0].index(b"SET")  # in the order given
    assert got == [[1], [True, None]]
    assert first.get("flag") == b"1"


def test_an_error_goes_to_its_sender_only(own_redis) -> None:
    client = redis.Redis.from_url(own_redis.url)
    client.set("not-a-list", "x")
    got: list[object] = []
    with redis_round.together():
        redis_round.send(client, [redis_round.command("lpush", "not-a-list", "a")], got.append)
        redis_round.send(client, [redis_round.command("lpush", "queue", "b")], got.append)
    (failed,), (pushed,) = got
    assert isinstance(failed, redis.ResponseError)
    assert pushed == 1


def test_an_unreachable_server_fails_every_send_of_it(own_redis) -> None:
    alive = redis.Redis.from_url(own_redis.url)
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    got: list[object] = []

    def failing(outcome: object) -> None:
        got.append(outcome)
        raise RuntimeError("a sender's own error")

    with redis_round.together():
        redis_round.send(dead, [redis_round.command("set", "a", 1)], failing)
        redis_round.send(dead, [redis_round.command("set", "b", 1)], got.append)
        redis_round.send(alive, [redis_round.command("set", "c", 1)], got.append)
    assert isinstance(got[0], redis.ConnectionError) and got[1] is got[0]
    assert got[2] == [True]  # in a round, a sender's error stops no one else

    # Alone, the sender's error is its caller's, as it would be without the round.
    with pytest.raises(RuntimeError):
        redis_round.send(dead, [redis_round.command("set", "a", 1)], failing)


def _submit(api: Any, repository: Any) -> str:
    """Submit a task through the API; its run's id."""
    response = api.post(
        "/api/tasks/",
        data=json.dumps({"repository": repository.pk, "instruction": "Fix it"}),
        content_type="application/json",
        headers={"Idempotency-Key": str(uuid.uuid4())},
    )
    assert response.status_code == 202
    return str(response.json()["run_id"])


@pytest.mark.django_db(transaction=True)
def test_a_submissions_wake_ups_are_its_message_and_one_round_trip(submitter, writes) -> None:
    assert settings.CELERY_BROKER_URL == settings.REDIS_URL  # the test setup: one server
    api, repository = submitter

    # No relay scheduled by an earlier test: its key, expiring between the two submissions
    # below, made the second one send the relay's task in a write of its own.
    relay.relay_wake_reset()
    _submit(api, repository)  # warm: the relay's first wake-up also sends its task
    writes.clear()
    _submit(api, repository)
    # Before the submission, its rate limits' checks (one per throttle that applies).
    throttles = [write for write in writes if b"agentplatform:throttle" in write]
    assert len(throttles) == 1  # the user's (the client is not a token's)
    others = [write for write in writes if write not in throttles]
    assert len(others) == 2, others
    # The run's message on the agent queue, sent by Celery's own producer (kombu).
    assert sum(b"LPUSH" in write and b"agent" in write for write in others) == 1
    # The relay's coalescing keys and the live views' announcement share one round trip.
    (round_trip,) = [write for write in others if b"agentplatform:relay:pending" in write]
    assert b"PUBLISH" in round_trip
