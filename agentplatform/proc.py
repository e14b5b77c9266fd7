"""Facts about processes from /proc: when one started, which belong to a group.

A pid alone is not a process: the kernel hands it out again once the process is reaped.
A pid with its start time is, and nothing here signals a pid whose start time differs
from the one recorded.
"""

from __future__ import annotations

from pathlib import Path


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot; None when it is gone or a
    zombie (exited, not reaped: no longer running anything)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def same_process(pid: int | None, started: int | None) -> bool:
    """Whether ``pid`` still is the process that started at ``started``."""
    return bool(pid) and started is not None and start_time(pid or 0) == started


def group_members(pgid: int) -> list[int]:
    """Live processes of the process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members
