"""CPU and memory of process trees, read from /proc (the realistic benchmark's accounts).

A tree's CPU is exact: the sum over its live processes of their own time and the time of
their children already reaped (``utime + stime + cutime + cstime``); the difference of two
such sums is what the tree spent in between, whatever started and ended meanwhile. Where
that time went among a worker's children (git, bubblewrap starting a sandbox, the
commands in it) is sampled: a process seen alive is charged what it had spent when last
seen, so a child that lived less than a sampling interval is left to ``unsampled``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    comm: str
    own: float  # seconds on a CPU: utime + stime
    reaped: float  # of its children already waited for: cutime + cstime


def processes() -> dict[int, Proc]:
    found: dict[int, Proc] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        head, _, rest = raw.rpartition(")")
        fields = rest.split()
        if len(fields) < 15 or fields[0] == "Z":
            continue
        found[int(entry.name)] = Proc(
            pid=int(entry.name),
            ppid=int(fields[1]),
            comm=head.partition("(")[2],
            own=(int(fields[11]) + int(fields[12])) / TICK,
            reaped=(int(fields[13]) + int(fields[14])) / TICK,
        )
    return found


def descendants(table: dict[int, Proc], roots: list[int]) -> list[Proc]:
    """The roots and everything below them (roots that are gone are skipped)."""
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    out: list[Proc] = []
    stack = [pid for pid in roots if pid in table]
    while stack:
        pid = stack.pop()
        out.append(table[pid])
        stack.extend(children.get(pid, []))
    return out


def platform_processes(table: dict[int, Proc], roots: list[int]) -> list[Proc]:
    """The roots and their children of the same program (a prefork worker's pool)."""
    found = [table[pid] for pid in roots if pid in table]
    names = {(p.pid, p.comm) for p in found}
    found += [p for p in table.values() if (p.ppid, p.comm) in names]
    return found


def tree_cpu(table: dict[int, Proc], roots: list[int]) -> tuple[float, float]:
    """(own, children's) CPU seconds of the trees under ``roots``: ``own`` is what the
    platform's processes spent themselves, ``children's`` all the rest (git, sandboxes,
    the commands in them), reaped or alive."""
    own = sum(p.own for p in platform_processes(table, roots))
    total = sum(p.own + p.reaped for p in descendants(table, roots))
    return own, total - own


def pss_bytes(pid: int) -> int:
    """Proportional set size: shared pages (a prefork pool's) counted once in all."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass
class ChildSampler:
    """Charges a worker's children by kind, as last seen alive (see the module's note)."""

    seen: dict[int, tuple[str, float]] = field(default_factory=dict)

    def sample(self, table: dict[int, Proc], worker_roots: list[int]) -> None:
        platform = {p.pid for p in platform_processes(table, worker_roots)}
        kinds: dict[int, str] = {}
        # Parents before children: a child's kind follows its parent's.
        for proc in _parents_first(table, worker_roots):
            if proc.pid in platform:
                continue
            parent_kind = kinds.get(proc.ppid, "")
            if parent_kind in ("sandbox start", "commands and tests"):
                kind = "sandbox start" if proc.comm == "bwrap" else "commands and tests"
            elif proc.comm == "bwrap":
                kind = "sandbox start"
            elif proc.comm.startswith("git") or parent_kind == "git":
                kind = "git"
            else:
                kind = "other children"
            kinds[proc.pid] = kind
            self.seen[proc.pid] = (kind, proc.own)

    def by_kind(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for kind, seconds in self.seen.values():
            totals[kind] = totals.get(kind, 0.0) + seconds
        return totals


def _parents_first(table: dict[int, Proc], roots: list[int]) -> list[Proc]:
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    out: list[Proc] = []
    queue = [pid for pid in roots if pid in table]
    while queue:
        pid = queue.pop(0)
        out.append(table[pid])
        queue.extend(children.get(pid, []))
    return out


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (every core, /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / TICK
