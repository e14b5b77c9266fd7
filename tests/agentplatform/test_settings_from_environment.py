"""Settings come from the environment; bad values and unsafe production settings fail."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentplatform import embedded

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.no_services

PRODUCTION = {
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/test",
    "CELERY_BROKER_URL": "redis://127.0.0.1:6379/0",
    "SECRET_KEY": "a-long-random-production-secret-key-0123456789abcdef",
}


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k
        not in {
            "DATABASE_URL",
            "CELERY_BROKER_URL",
            "REDIS_URL",
            "SECRET_KEY",
            "DEBUG",
            "DJANGO_SETTINGS_MODULE",
        }
    }
    clean["DJANGO_SETTINGS_MODULE"] = "agentplatform.settings"
    clean["AGENTPLATFORM_VAR_DIR"] = env.pop("AGENTPLATFORM_VAR_DIR", str(ROOT / "var" / "ci"))
    clean.update(env)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_production_mode_refuses_debug():
    result = manage("check", **PRODUCTION, DEBUG="true")
    assert result.returncode != 0
    assert "agentplatform.E001" in result.stderr


def test_production_mode_refuses_the_default_secret_key():
    env = {**PRODUCTION}
    del env["SECRET_KEY"]
    result = manage("check", **env)
    assert result.returncode != 0
    assert "agentplatform.E002" in result.stderr


def test_production_mode_with_safe_settings_passes_the_check():
    result = manage("check", **PRODUCTION)
    assert result.returncode == 0, result.stderr


def test_embedded_default_needs_no_configuration(embedded_var):
    """Nothing set: the settings start PostgreSQL and Valkey with their data under the
    var directory and point the database and the broker at them."""
    try:
        result = manage(
            "shell",
            "-c",
            "from django.conf import settings as s; print(s.DATABASE_URL, "
            "s.CELERY_BROKER_URL, s.REDIS_URL, s.EMBEDDED)",
            AGENTPLATFORM_VAR_DIR=str(embedded_var),
        )
        assert result.returncode == 0, result.stderr
        endpoints = embedded.running(embedded_var)
        assert endpoints is not None
        assert result.stdout.splitlines()[-1].split() == [
            endpoints.database_url,
            endpoints.redis_url,
            endpoints.redis_url,
            "True",
        ]
        assert (embedded_var / "postgres" / "PG_VERSION").exists()
    finally:
        embedded.stop(embedded_var)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DEBUG", "maybe"),
        ("RUN_LEASE_SECONDS", "soon"),
        ("DATABASE_URL", "mysql://x/y"),
        ("CELERY_BROKER_URL", "sqs://nowhere"),
        ("BUDGET_COST_USD", "lots"),
    ],
)
def test_a_bad_value_fails_loudly_with_its_name(name, value, tmp_path):
    # Servers named (nowhere): a bad value fails before any embedded server would start.
    servers = {"DATABASE_URL": "postgres://x@127.0.0.1:9/x", "REDIS_URL": "redis://127.0.0.1:9"}
    result = manage("check", AGENTPLATFORM_VAR_DIR=str(tmp_path), **{**servers, name: value})
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert name in result.stderr
