"""Pub/sub channels are one namespace per Redis server: a run's live-view channel carries
the Redis database's number, so deployments on one server never wake each other's views."""

from __future__ import annotations

import pytest
from django.test import override_settings

from agentplatform.api import notify
from agentplatform.settings import _redis_database
from jobs import relay


@pytest.mark.no_services
def test_the_channel_names_the_database_of_redis_url() -> None:
    assert _redis_database("redis://127.0.0.1:6379/0") == 0
    assert _redis_database("redis://127.0.0.1:6379/7") == 7
    assert _redis_database("redis://127.0.0.1:6379") == 0
    assert _redis_database("rediss://:pw@host:6380/3?ssl_cert_reqs=none") == 3
    assert _redis_database("unix:///run/redis.sock?db=5") == 5
    for db in (1, 2):
        with override_settings(RUN_CHANNEL_PREFIX=f"agent.db{db}.run."):
            # The publishers (a request's commit, the relay) and the streams' hub agree.
            assert notify.run_channel("r1") == relay.run_channel("r1") == f"agent.db{db}.run.r1"
            assert notify.run_channel("r1").startswith(notify.channel_prefix())
