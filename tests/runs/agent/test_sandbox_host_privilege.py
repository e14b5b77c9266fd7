"""A sandboxed command holds no host privilege, whoever runs the worker (here: root, as
in CI): its uid is unprivileged on the host, /proc/sys and /dev are read-only, and its
whole tree shares one memory limit. Each test is a real attempt through the tool layer
on the real bubblewrap backend."""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
import uuid
from pathlib import Path

import pytest

from runs.agent.backends import backend_get
from runs.agent.sandbox import LocalSandbox, ResourceLimits
from runs.agent.tools import Toolbox, ToolPolicy

pytestmark = pytest.mark.no_services

MiB = 1024**2


@pytest.fixture(autouse=True)
def _root_worker_on_bubblewrap(settings):
    assert settings.SANDBOX_BACKEND == "bubblewrap"
    assert os.geteuid() == 0, "these attempts are meant to run as root, as CI runs workers"
    assert not backend_get().problems()


def _box(root: Path, **limits: int) -> LocalSandbox:
    values = {
        "cpu_seconds": 60,
        "memory_bytes": 256 * MiB,
        "file_size_bytes": 1024 * MiB,
        "processes": 64,
        "workspace_bytes": 64 * MiB,
        "tmp_bytes": 16 * MiB,
    }
    values.update(limits)
    box = LocalSandbox(f"run-{uuid.uuid4()}-1", ResourceLimits(**values))
    box.create()
    return box


@pytest.fixture
def box(tmp_path, settings):
    settings.SANDBOX_ROOT = tmp_path / "sandboxes"
    box = _box(settings.SANDBOX_ROOT)
    yield box
    box.remove()


def _python(box: LocalSandbox, code: str, timeout: float = 60):
    (box.path / "attempt.py").write_text(code)
    toolbox = Toolbox(box, ToolPolicy(allowed_commands=["python3"], command_timeout=timeout))
    arguments = {"command": "python3 attempt.py"}
    toolbox.check("run_command", arguments)
    return toolbox.execute("run_command", arguments)


def _host_pids_with(token: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _host_ids(pid: int) -> tuple[set[int], str]:
    """The process's uids as the host sees them, and its uid map read from the host."""
    status = Path(f"/proc/{pid}/status").read_text()
    uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
    return {int(uid) for uid in uids}, Path(f"/proc/{pid}/uid_map").read_text()


def test_the_sandbox_user_is_not_host_root(box):
    token = f"2.{uuid.uuid4().int % 10**6:06d}"  # a unique sleep of about 2 s
    code = (
        "import os, sys, time\n"
        "open('uid_map.txt', 'w').write(open('/proc/self/uid_map').read())\n"
        f"os.execvp('sleep', ['sleep', '{token}'])\n"
    )
    outcome: dict[str, object] = {}
    worker = threading.Thread(target=lambda: outcome.update(result=_python(box, code)))
    worker.start()
    seen: list[tuple[set[int], str]] = []
    deadline = time.monotonic() + 20
    while not seen and time.monotonic() < deadline:
        for pid in _host_pids_with(f"sleep\0{token}"):
            try:
                seen.append(_host_ids(pid))
            except (OSError, StopIteration):
                continue
        time.sleep(0.05)
    worker.join(timeout=60)

    assert seen, "the sandboxed sleep never appeared on the host"
    uids, host_map = seen[0]
    assert 0 not in uids, f"the command runs as host uid {uids}"
    # Read from the host, the map translates the sandbox's uid into host uids.
    inside, outside, count = (int(field) for field in host_map.split())
    assert inside == 1000 and outside != 0 and count == 1, host_map
    assert outcome["result"].status == "completed", outcome["result"].output
    # Read inside, the map names the same unprivileged host uid (one namespace deep).
    assert (box.path / "uid_map.txt").read_text().split() == ["1000", str(outside), "1"]
    # What the command wrote belongs to that unprivileged uid on the host, too.
    assert (box.path / "uid_map.txt").stat().st_uid == outside


def _command_cgroups(pid: int) -> dict[str, Path]:
    """The per-command cgroups (agentplatform-<hex>) a host process is in, by controller
    ("" for cgroup v2), read from the host's own view of cgroups and mounts."""
    mounts: dict[str, Path] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, extra = line.partition(" - ")
        fstype, _, options = extra.split()[:3]
        if fstype == "cgroup2":
            mounts[""] = Path(fields.split()[4])
        elif fstype == "cgroup":
            for option in options.split(","):
                mounts.setdefault(option, Path(fields.split()[4]))
    found = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if path.rsplit("/", 1)[-1].startswith("agentplatform-"):
            for controller in controllers.split(",") if controllers else [""]:
                if controller in mounts:
                    found[controller] = mounts[controller] / path.lstrip("/")
    return found


def test_a_commands_cgroup_holds_its_tree_and_is_gone_after_a_timeout(box):
    token = f"30.{uuid.uuid4().int % 10**6:06d}"
    code = f"import subprocess\nsubprocess.run(['sleep', '{token}'])\n"
    outcome: dict[str, object] = {}
    worker = threading.Thread(target=lambda: outcome.update(result=_python(box, code, 3)))
    worker.start()
    dirs: dict[str, Path] = {}
    deadline = time.monotonic() + 20
    while not dirs and time.monotonic() < deadline:
        for pid in _host_pids_with(f"sleep\0{token}"):
            with contextlib.suppress(OSError):
                dirs.update(_command_cgroups(pid))
        time.sleep(0.05)
    # The sandbox's grandchild is in the command's memory-limited cgroup.
    memory = dirs.get("memory") or dirs.get("")
    assert memory is not None, dirs
    knob = memory / ("memory.limit_in_bytes" if "memory" in dirs else "memory.max")
    assert int(knob.read_text()) <= box.limits.memory_bytes
    worker.join(timeout=30)

    assert outcome["result"].status == "timed_out"
    assert not _host_pids_with(f"sleep\0{token}")
    assert not [path for path in dirs.values() if path.exists()], dirs


def test_a_command_cannot_make_a_user_namespace_of_its_own(box):
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        # 0x10000000: CLONE_NEWUSER
        "print('unshare', libc.unshare(0x10000000), ctypes.get_errno(), flush=True)\n"
        "os.execvp('unshare', ['unshare', '--user', '--map-root-user', 'id', '-u'])\n"
    )

    result = _python(box, code)

    assert f"unshare -1 {errno.EPERM}" in result.output, result.output
    assert "unshare failed" in result.output and "\n0\n" not in result.output, result.output


def test_a_proc_sys_write_fails_and_the_host_value_is_unchanged(box):
    targets = ["/proc/sys/vm/stat_interval", "/proc/sys/kernel/core_pattern"]
    before = {path: Path(path).read_text() for path in targets}
    code = (
        "for path in " + repr(targets) + ":\n"
        "    value = open(path).read()\n"
        "    try:\n"
        "        with open(path, 'w') as f:\n"
        "            f.write(value)\n"
        "        print('written', path)\n"
        "    except OSError as exc:\n"
        "        print('refused', path, exc.errno)\n"
    )

    result = _python(box, code)

    assert "written" not in result.output, result.output
    assert result.output.count("refused") == len(targets), result.output
    assert {path: Path(path).read_text() for path in targets} == before


def test_nothing_under_proc_but_the_sandboxs_own_processes_is_writable(box):
    code = (
        "import os\n"
        "for top, dirs, files in os.walk('/proc'):\n"
        "    if top == '/proc':\n"
        "        dirs[:] = [d for d in dirs if not d.isdigit() and 'self' not in d]\n"
        "    for name in files:\n"
        "        path = os.path.join(top, name)\n"
        "        if os.access(path, os.W_OK):\n"
        "            print('writable', path)\n"
        "print('walked')\n"
    )

    result = _python(box, code)

    assert "walked" in result.output and "writable" not in result.output, result.output


def _available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable")


# Three processes of one command, each taking 3 GiB (96 x 32 MiB, every page touched).
HOG = """
import subprocess, sys
CHILD = '''
import sys
chunks = []
for i in range(96):
    chunks.append(b"x" * (32 << 20))
    print(sys.argv[1], (i + 1) * 32, flush=True)
'''
hogs = [subprocess.Popen([sys.executable, "-c", CHILD, str(n)]) for n in range(3)]
print("exits", [hog.wait() for hog in hogs], flush=True)
"""


def test_three_processes_of_3_gib_are_stopped_by_the_sandbox_memory_limit(box):
    limit = box.limits.memory_bytes
    before = _available_bytes()
    lowest = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            lowest[0] = min(lowest[0], _available_bytes())
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = _python(box, HOG, timeout=120)
    finally:
        done.set()
        sampler.join()

    reached: dict[str, int] = {}
    for line in result.output.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] in "012" and fields[1].isdigit():
            reached[fields[0]] = int(fields[1])
    # The kernel killed every one of them inside the sandbox, none got near its 3 GiB nor
    # past the one limit of the whole sandbox.
    assert "exits [-9, -9, -9]" in result.output, result.output[-2000:]
    assert max(reached.values()) * MiB <= limit, (reached, result.output[-2000:])
    assert "memory limit" in result.output, result.output[-2000:]
    # Other tenants of this host move its memory too: a generous margin, far below the
    # 9 GiB the three would take unconfined.
    assert before - lowest[0] < limit + 1024 * MiB
    # The worker (this process) is alive and the sandbox still runs commands.
    after = _python(box, "print('still here')\n")
    assert after.status == "completed" and "still here" in after.output


def test_writes_to_dev_are_bounded(box):
    tmp_bytes = box.limits.tmp_bytes
    code = (
        "import os\n"
        "for path in ('/dev/filler', '/dev/shm/filler', '/dev/null2'):\n"
        "    written = 0\n"
        "    try:\n"
        "        with open(path, 'wb') as f:\n"
        "            for _ in range(64):\n"
        "                written += f.write(b'x' * (1 << 20))\n"
        "                f.flush()\n"
        "    except OSError as exc:\n"
        "        print('stopped', path, exc.errno)\n"
        "    print('wrote', path, written, flush=True)\n"
    )

    result = _python(box, code)

    wrote = {
        fields[1]: int(fields[2])
        for fields in (line.split() for line in result.output.splitlines())
        if len(fields) == 3 and fields[0] == "wrote"
    }
    assert wrote.get("/dev/filler") == 0 and wrote.get("/dev/null2") == 0, result.output
    assert wrote.get("/dev/shm/filler", -1) <= tmp_bytes, result.output


def test_handing_the_working_copy_over_never_follows_a_link(box, tmp_path):
    host_file = tmp_path / "host-owned"
    host_file.write_text("root's\n")
    host_dir = tmp_path / "host-dir"
    host_dir.mkdir()
    (host_dir / "inner").write_text("root's\n")
    code = (
        "import os\n"
        f"os.symlink({str(host_file)!r}, 'file-link')\n"
        f"os.symlink({str(host_dir)!r}, 'dir-link')\n"
    )
    assert _python(box, code).status == "completed"

    # The next command hands the working copy over again, links included.
    assert _python(box, "print('again')\n").status == "completed"

    assert os.lstat(box.path / "file-link").st_uid != 0
    for path in (host_file, host_dir, host_dir / "inner"):
        assert path.stat().st_uid == 0, path
