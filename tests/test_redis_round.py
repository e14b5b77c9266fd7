"""A commit's wake-ups go to Redis in one round trip per server, and each sender still
gets its own results, its own errors, and its fallback when Redis is gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from redis.connection import AbstractConnection

from jobs import redis_round, relay
from tests.conftest import SilentServer, queue_lists, wait_for

ROOT = Path(__file__).resolve().parent.parent

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
def test_a_submissions_wake_ups_are_one_round_trip(submitter, writes) -> None:
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
    (write,) = [write for write in writes if write not in throttles]
    # The run's message on the agent queue, the relay's coalescing keys, the live views.
    assert b"LPUSH" in write and b"agent" in write
    assert b"agentplatform:relay:pending" in write and b"PUBLISH" in write


# --- WAKE_UPS_BATCHED: rounds sent from a thread of the process's own -------------------


@pytest.fixture
def batched(settings) -> Iterator[None]:
    settings.WAKE_UPS_BATCHED = True
    yield
    redis_round._sending.flush()  # nothing of this test's is left for the next one


def _round(client: redis.Redis, value: str, done: redis_round.Done) -> None:
    """What a request's commit does: a block of one send."""
    with redis_round.together():
        redis_round.send(client, [redis_round.command("lpush", "queue", value)], done)


def _sending_held(client: redis.Redis) -> tuple[threading.Event, list[object]]:
    """Hand over a first round whose ``done`` holds the sending thread until the event
    returned is set; its result goes into the list returned."""
    release, inside, held = threading.Event(), threading.Event(), []

    def hold(outcome: object) -> None:
        inside.set()
        release.wait(30)
        held.append(outcome)

    _round(client, "first", hold)
    assert inside.wait(30), "the sending thread took the first round"
    return release, held


def test_requests_hand_over_their_rounds_and_those_go_in_one_write(
    own_redis, writes, batched
) -> None:
    client = redis.Redis.from_url(own_redis.url)
    client.ping()
    writes.clear()
    release, held = _sending_held(client)
    got: list[object] = []
    requests = [
        threading.Thread(target=_round, args=(client, f"request-{n}", got.append))
        for n in range(20)
    ]
    for request in requests:
        request.start()
    for request in requests:
        request.join(30)
    # Every request went on while the thread was busy: none of them waited on Redis.
    assert not any(request.is_alive() for request in requests)
    assert client.llen("queue") == 1 and got == []
    release.set()
    wait_for(lambda: len(got) == 20, timeout=30, message="every round's results")
    assert held == [[1]]
    assert sorted(got) == [[n] for n in range(2, 22)]  # each its own LPUSH's result
    # The first round, then the twenty handed over meanwhile.
    assert len([write for write in writes if b"LPUSH" in write]) == 2
    assert client.llen("queue") == 21


def test_over_the_backlog_limit_the_oldest_rounds_are_dropped(
    own_redis, batched, monkeypatch
) -> None:
    monkeypatch.setattr(redis_round, "BACKLOG_LIMIT", 5)
    client = redis.Redis.from_url(own_redis.url)
    release, _ = _sending_held(client)
    got: list[object] = []
    for n in range(8):
        _round(client, f"request-{n}", got.append)
    release.set()
    wait_for(lambda: len(got) == 5, timeout=30, message="the rounds kept")
    values = [value.decode() for value in reversed(client.lrange("queue", 0, -1))]
    assert values == ["first"] + [f"request-{n}" for n in range(3, 8)]


def test_a_forked_child_sends_its_own_rounds_and_not_its_parents(own_redis, batched) -> None:
    """A child forked while the parent's sending thread is inside a send (holding its
    lock) and has a round waiting: the child's rounds go out, the parent's only once."""
    client = redis.Redis.from_url(own_redis.url)
    release, _held = _sending_held(client)
    _round(client, "parent", None)
    pid = os.fork()
    if pid == 0:  # the child: no pytest from here on, only its exit status
        status = 1
        try:
            _round(redis.Redis.from_url(own_redis.url), "child", None)
            redis_round._sending.flush()
            status = 0
        finally:
            os._exit(status)
    try:
        deadline = time.monotonic() + 20
        while (exited := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if exited[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the child hung on a lock its parent's sending thread held")
        assert os.waitstatus_to_exitcode(exited[1]) == 0
    finally:
        release.set()
    wait_for(lambda: client.llen("queue") == 3, timeout=30, message="the parent's round")
    time.sleep(0.2)
    values = [value.decode() for value in reversed(client.lrange("queue", 0, -1))]
    assert values == ["first", "child", "parent"]


EXIT_SCRIPT = """
import sys, threading, time
import django
django.setup()
import redis
from jobs import redis_round

client = redis.Redis.from_url(sys.argv[1])
inside = threading.Event()

def slow(outcome):
    inside.set()
    time.sleep(0.5)  # the sending thread is busy when the process exits

with redis_round.together():
    redis_round.send(client, [redis_round.command("lpush", "queue", "first")], slow)
inside.wait(30)
for n in range(300):
    with redis_round.together():
        redis_round.send(client, [redis_round.command("lpush", "queue", n)])
"""


def test_rounds_handed_over_before_a_graceful_exit_are_sent(own_redis) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "agentplatform.settings",
        "WAKE_UPS_BATCHED": "true",
    }
    done = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT, own_redis.url],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert redis.Redis.from_url(own_redis.url).llen("queue") == 301


@pytest.mark.django_db(transaction=True)
def test_a_submission_in_a_batched_process_wakes_its_run(submitter, batched) -> None:
    api, repository = submitter
    queued = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    lists = queue_lists("agent")
    before = sum(queued.llen(key) for key in lists)
    run_id = _submit(api, repository)
    wait_for(
        lambda: sum(queued.llen(key) for key in lists) > before,
        timeout=30,
        message="the run's message",
    )
    bodies = [json.loads(entry) for key in lists for entry in queued.lrange(key, 0, -1)]
    assert any(
        body["headers"]["task"] == "runs.step"
        and body["headers"]["argsrepr"].startswith(f"('{run_id}'")
        for body in bodies
    )


@pytest.mark.django_db(transaction=True)
def test_a_submission_does_not_wait_on_a_broker_that_does_not_answer(
    submitter, batched, broker_at
) -> None:
    from runs.models import Run

    api, repository = submitter
    silent = SilentServer()
    broker_at(silent.url)
    try:
        # Answered and committed while the run's message is still on its way: the
        # sending thread waits for the broker's answers, which do not come.
        run_id = _submit(api, repository)
        assert Run.objects.filter(pk=run_id, status=Run.Status.QUEUED).exists()
        wait_for(lambda: silent.received, timeout=30, message="the sending thread's connection")
        assert redis_round._sending.sending()
    finally:
        silent.close()
        broker_at(None)


@pytest.mark.timeout(60)
def test_a_publish_left_to_kombu_gives_up_on_a_broker_that_does_not_answer(
    monkeypatch, broker_at
) -> None:
    from agentplatform.celery import app
    from jobs import producer

    monkeypatch.setattr(producer, "KOMBU_TIMEOUT", 0.5)
    silent = SilentServer()
    broker_at(silent.url)
    try:
        sender = producer.RedisListProducer(app, silent.url)
        options = {"exchange": "", "routing_key": "agent", "serializer": "json"}
        with pytest.raises(Exception):  # kombu's error once its retries are spent
            sender._kombu_publish({"hello": "world"}, {**options, "retry": False})
        assert silent.received  # it did talk to the server
    finally:
        silent.close()
        broker_at(None)
