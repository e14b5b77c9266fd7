"""Pub/sub channels are one namespace per Redis server: a run's live-view channel carries
the Redis database's number, so deployments on one server never wake each other's views."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.test import override_settings

from agentplatform.settings.services import _redis_database
from jobs import relay

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.no_services
def test_the_channel_names_the_database_of_redis_url() -> None:
    assert _redis_database("redis://127.0.0.1:6379/0") == 0
    assert _redis_database("redis://127.0.0.1:6379/7") == 7
    assert _redis_database("redis://127.0.0.1:6379") == 0
    assert _redis_database("rediss://:pw@host:6380/3?ssl_cert_reqs=none") == 3
    assert _redis_database("unix:///run/redis.sock?db=5") == 5
    for db in (1, 2):
        with override_settings(RUN_CHANNEL_PREFIX=f"agent.db{db}.run."):
            # The publisher (the timeline, through the relay's name) and the streams' hub
            # (which subscribes to the prefix) agree.
            assert relay.run_channel("r1") == f"agent.db{db}.run.r1"
            assert relay.run_channel("r1").startswith(settings.RUN_CHANNEL_PREFIX)


@pytest.mark.no_services
def test_processes_on_other_databases_of_one_server_use_other_channels() -> None:
    # What each process reads from its environment: the same server, two databases.
    show = "from jobs import relay; print(relay.run_channel('r1'))"
    channels = []
    for url in ("redis://127.0.0.1:6379/1", "redis://127.0.0.1:6379/2"):
        env = {**os.environ, "REDIS_URL": url, "CELERY_BROKER_URL": url}
        env["DJANGO_SETTINGS_MODULE"] = "agentplatform.settings"
        out = subprocess.run(
            [sys.executable, "-c", f"import django; django.setup(); {show}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        channels.append(out.stdout.strip())
    assert channels == ["agent.db1.run.r1", "agent.db2.run.r1"]
