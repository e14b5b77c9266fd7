"""Where a worker could not contain commands, the system check says what is missing and
the worker refuses to start. Simulated by configuration (a cgroup root that does not
exist, a host uid that is root), never by mocking the kernel."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.no_services

ROOT = Path(__file__).resolve().parents[3]


def _environment(**overrides: str) -> dict[str, str]:
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", **overrides}


def _check(**overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=_environment(**overrides),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_check_passes_where_containment_works():
    result = _check()

    assert "agentplatform.E004" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("overrides", "explanation"),
    [
        ({"SANDBOX_CGROUP_ROOT": "/sys/fs/cgroup/agentplatform-missing"}, "does not exist"),
        ({"SANDBOX_HOST_UID": "0", "SANDBOX_HOST_GID": "0"}, "would be host root"),
    ],
)
def test_the_check_refuses_and_explains(overrides, explanation):
    if "SANDBOX_HOST_UID" in overrides and os.geteuid() != 0:
        pytest.skip("only a root worker switches to SANDBOX_HOST_UID")

    result = _check(**overrides)

    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "agentplatform.E004" in output and explanation in output, output
    assert "cgroup v2" in output and "user namespaces" in output  # what a deployment needs


def test_a_worker_that_cannot_contain_refuses_to_start(tmp_path):
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "agentplatform", "worker", "-P", "solo"],
            cwd=ROOT,
            env=_environment(SANDBOX_CGROUP_ROOT=str(tmp_path / "no-cgroup-here")),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = worker.wait(timeout=60)
        finally:
            if worker.poll() is None:
                os.killpg(worker.pid, 9)
                worker.wait()
    output = log.read_text(errors="replace")
    assert code != 0, output
    assert "cannot contain" in output and "does not exist" in output, output
    assert "ready." not in output
