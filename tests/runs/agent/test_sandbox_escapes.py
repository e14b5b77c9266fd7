"""Escape attempts through the real tool layer on the real backend (bubblewrap): each one
fails, and the platform stays healthy.

The commands run as a model would run them: ``Toolbox.check`` then ``Toolbox.execute``
of ``run_command`` in a working copy under SANDBOX_ROOT, next to another run's working
copy, with platform secrets in the worker's environment.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
from django.conf import settings as django_settings

from runs.agent.backends import backend_get
from runs.agent.sandbox import LocalSandbox, ResourceLimits, WorkspaceTooLarge
from runs.agent.tools import Toolbox, ToolPolicy

pytestmark = pytest.mark.no_services

SECRET = "ghp_" + "EscapeCanary" * 4


@pytest.fixture(autouse=True)
def _bubblewrap(settings):
    assert settings.SANDBOX_BACKEND == "bubblewrap", "the escape suite runs on bubblewrap"
    assert not backend_get().problems()


@pytest.fixture
def boxes(tmp_path, settings, monkeypatch):
    """This run's working copy and another tenant's, with secrets in the worker's env."""
    for name in ("GITHUB_TOKEN", "OPENAI_API_KEY", "SECRET_KEY", "DATABASE_URL"):
        monkeypatch.setenv(name, SECRET)
    settings.SANDBOX_ROOT = tmp_path / "sandboxes"
    limits = ResourceLimits(
        cpu_seconds=20,
        memory_bytes=1024**3,
        file_size_bytes=16 * 1024**2,
        processes=64,
        workspace_bytes=24 * 1024**2,
        tmp_bytes=8 * 1024**2,
    )
    mine = LocalSandbox("run-mine-1", limits)
    other = LocalSandbox("run-other-1", limits)
    for box in (mine, other):
        box.create()
    (other.path / "private.txt").write_text(f"other tenant {SECRET}\n")
    return mine, other


def _run(box: LocalSandbox, command: str, timeout: float = 30):
    toolbox = Toolbox(
        box, ToolPolicy(allowed_commands=["python3", "git", "sh"], command_timeout=timeout)
    )
    arguments = {"command": command}
    toolbox.check("run_command", arguments)
    return toolbox.execute("run_command", arguments)


def _python(box: LocalSandbox, code: str, timeout: float = 30):
    (box.path / "attempt.py").write_text(code)
    return _run(box, "python3 attempt.py", timeout)


def test_ancestors_environ_holds_no_secret(boxes):
    mine, _ = boxes
    result = _python(
        mine,
        "import os\n"
        "for pid in os.listdir('/proc'):\n"
        "    if pid.isdigit():\n"
        "        try: print(pid, open(f'/proc/{pid}/environ').read())\n"
        "        except OSError as e: print(pid, e)\n"
        "print('ppid', open('/proc/%d/environ' % os.getppid()).read())\n",
    )
    assert result.status == "completed", result.output
    assert "ppid" in result.output
    assert "EscapeCanary" not in result.output and "GITHUB_TOKEN" not in result.output


def test_host_processes_are_out_of_sight(boxes):
    mine, _ = boxes
    result = _python(
        mine, "import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
    )
    pids = eval(result.output.split("\n", 1)[1])  # noqa: S307 - our own printed list
    assert max(pids) < 10, pids  # a fresh pid namespace: bwrap, the shell, python


def test_another_runs_working_copy_is_unreachable(boxes):
    mine, other = boxes
    for path in (other.path, Path("..") / other.path.name, mine.path.parent):
        result = _python(
            mine,
            f"import os\np = {str(path)!r}\n"
            "try: print(os.listdir(p))\nexcept OSError as e: print('refused', e)\n"
            "try: open(os.path.join(p, 'private.txt'), 'a').write('pwned')\n"
            "except OSError as e: print('refused', e)\n",
        )
        assert "EscapeCanary" not in result.output and "refused" in result.output
    assert (other.path / "private.txt").read_text() == f"other tenant {SECRET}\n"


def test_platform_code_venv_database_and_root_are_not_mounted(boxes):
    mine, _ = boxes
    targets = [
        Path(django_settings.BASE_DIR) / "agentplatform" / "settings" / "__init__.py",
        Path(sys.prefix) / "pyvenv.cfg",
        Path(django_settings.VAR_DIR),
        Path("/root"),
        Path("/work"),
    ]
    code = "import os\n" + "".join(
        f"print({str(t)!r}, os.path.exists({str(t)!r}))\n" for t in targets
    )
    result = _python(mine, code)
    assert result.status == "completed", result.output
    assert "True" not in result.output, result.output


def test_the_platform_virtualenv_cannot_be_written(boxes):
    mine, _ = boxes
    site = next(Path(sys.prefix).glob("lib/python3*/site-packages"))
    planted = site / "zz_escape.pth"
    result = _python(
        mine,
        f"open({str(planted)!r}, 'w').write('import os; os.system(\"id\")')\n",
    )
    assert result.data["exit_code"] != 0
    assert not planted.exists()
    for system in ("/usr/lib/python3/dist-packages/zz_escape.pth", "/usr/zz", "/etc/zz"):
        result = _python(mine, f"open({system!r}, 'w').write('x')\n")
        assert result.data["exit_code"] != 0 and not Path(system).exists()


@pytest.mark.parametrize("target", ["DATABASE_URL", "REDIS_URL"])
def test_no_network_to_postgres_or_redis(boxes, target):
    parsed = urlparse(os.environ.get(target) or "redis://127.0.0.1:6379")
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 6379
    with socket.create_connection((host, port), timeout=2):
        pass  # reachable from the worker ...
    mine, _ = boxes
    result = _python(
        mine,
        f"import socket\ntry:\n    socket.create_connection(({host!r}, {port}), timeout=2)\n"
        "    print('CONNECTED')\nexcept OSError as e:\n    print('refused', e)\n",
    )
    assert "CONNECTED" not in result.output and "refused" in result.output  # ... not from it


def test_git_alias_shell_is_contained(boxes):
    mine, _ = boxes
    (mine.path / "payload.sh").write_text(
        "id -u; cat /proc/1/environ; ls /root; cat ../run-other-1/private.txt\n"
    )
    result = _run(mine, "git -c alias.x='!sh payload.sh' x")
    assert "EscapeCanary" not in result.output
    assert "1000" in result.output  # the shell ran, as the sandbox user, and saw nothing


def test_fork_bomb_hits_the_process_limit(boxes):
    mine, _ = boxes
    result = _python(
        mine,
        "import os, time\nn = 0\n"
        "for _ in range(500):\n"
        "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
        "    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
        "    n += 1\nprint('forked', n)\n",
        timeout=20,
    )
    forked = int(result.output.split("forked", 1)[1].split()[0])
    assert forked < 64
    # Everything it started died with the command (its pid namespace is gone).
    assert _python(mine, "print('healthy')").output.strip().endswith("healthy")


def test_filling_the_disk_is_stopped(boxes):
    mine, _ = boxes
    with pytest.raises(WorkspaceTooLarge):
        _python(
            mine,
            "import os\nos.makedirs('fill', exist_ok=True)\n"
            "for i in range(100):\n"
            "    open(f'fill/{i}', 'wb').write(b'0' * (4 * 1024 * 1024))\n",
        )
    shutil.rmtree(mine.path / "fill")
    tmp = _python(mine, "open('/tmp/fill', 'wb').write(b'0' * (64 * 1024 * 1024))\n")
    assert tmp.data["exit_code"] != 0  # /tmp is a small private tmpfs
    # The host /tmp got nothing.
    assert not Path("/tmp/fill").exists()


def test_processes_are_unprivileged_and_capability_free(boxes):
    mine, _ = boxes
    (mine.path / "who.sh").write_text(
        "id -u\ngrep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status\n"
    )
    result = _run(mine, "sh who.sh")
    lines = result.output.splitlines()
    assert "1000" in lines
    assert "CapEff:\t0000000000000000" in lines and "CapBnd:\t0000000000000000" in lines
    assert "NoNewPrivs:\t1" in lines


def test_the_process_backend_is_refused_in_production(settings):
    from agentplatform.checks import production_settings_check

    settings.PRODUCTION = True
    settings.SANDBOX_BACKEND = "process"
    ids = [error.id for error in production_settings_check(None)]
    assert "agentplatform.E003" in ids
    settings.SANDBOX_BACKEND = "bubblewrap"
    assert "agentplatform.E003" not in [e.id for e in production_settings_check(None)]
