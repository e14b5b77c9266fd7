"""Sandboxed commands see no host secrets, are capped, limited and confined."""

from __future__ import annotations

import pytest

from runs.agent.sandbox import (
    LocalSandbox,
    ResourceLimits,
    sandbox_orphans_sweep,
)

pytestmark = pytest.mark.no_services


@pytest.fixture
def sandbox(tmp_path, settings):
    settings.SANDBOX_ROOT = tmp_path / "sandboxes"
    box = LocalSandbox(
        "run-confined",
        ResourceLimits(cpu_seconds=5, memory_bytes=1024**3, file_size_bytes=1024 * 1024),
    )
    box.create()
    yield box
    box.remove()


def test_host_secrets_do_not_reach_commands(sandbox, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_secret")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")

    result = sandbox.run(["python3", "-c", "import os; print(sorted(os.environ))"])

    assert result.ok
    assert "GITHUB_TOKEN" not in result.output and "OPENAI_API_KEY" not in result.output
    assert "DATABASE_URL" not in result.output


def test_output_is_capped(sandbox, settings):
    settings.COMMAND_OUTPUT_LIMIT_BYTES = 1000

    result = sandbox.run(["python3", "-c", "print('x' * 100000)"])

    assert result.truncated
    assert len(result.output) < 1100 and result.output.endswith("[output truncated]")


def test_file_size_limit_stops_runaway_writes(sandbox):
    result = sandbox.run(["python3", "-c", "open('big', 'wb').write(b'0' * (4 * 1024 * 1024))"])

    assert not result.ok
    assert (sandbox.path / "big").stat().st_size <= 1024 * 1024


def test_timeout_kills_the_command(sandbox):
    result = sandbox.run(["python3", "-c", "import time; time.sleep(30)"], timeout=0.5)

    assert result.timed_out and result.exit_code is None
    assert result.duration_ms < 5000


def test_orphan_sandboxes_are_swept(sandbox):
    other = LocalSandbox("run-ended")
    other.create()

    removed = sandbox_orphans_sweep(active_run_ids={"confined"})

    assert removed == ["run-ended"]
    assert sandbox.exists() and not other.exists()
