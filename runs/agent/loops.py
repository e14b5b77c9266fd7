"""Loops that make no progress: the same calls getting the same answers, turn after turn.

A model that has fixed the bug and then re-reads the same file forever spends its
whole budget learning nothing. A call's signature is its tool, its arguments and the
output it got; a turn is stale when every call in it repeats a signature from the
recent calls (same question, same answer: nothing new was learned or changed). After
``NUDGE_AFTER`` stale turns in a row the model is told so; after ``STOP_AFTER`` the
loop is stopped and what the working copy holds is submitted like a finished attempt.

The state is a small dict kept in the run's checkpoint, so a re-executed step judges
the replayed turns exactly as the original did.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

RECENT_CALLS = 16
NUDGE_AFTER = 3
STOP_AFTER = 6


@dataclass
class LoopVerdict:
    action: str  # "" | "nudge" | "stop"
    stale_turns: int
    repeated: list[str]


def call_signature(name: str, arguments: dict[str, Any], output: str) -> str:
    text = json.dumps([name, arguments, output], sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8", errors="replace")).hexdigest()[:20]


def loop_observe(
    state: dict[str, Any], calls: list[tuple[str, dict[str, Any], str]]
) -> LoopVerdict:
    """Record one turn's calls ``(name, arguments, output)`` in ``state`` (changed in
    place) and say whether to nudge the model or stop the loop."""
    recent: list[str] = list(state.get("recent", []))
    signatures = [call_signature(*call) for call in calls]
    stale = bool(signatures) and all(s in recent for s in signatures)
    streak = int(state.get("stale_turns", 0)) + 1 if stale else 0
    recent = [*recent, *signatures][-RECENT_CALLS:]
    state["recent"] = recent
    state["stale_turns"] = streak
    repeated = [f"{name}({json.dumps(args, sort_keys=True)[:120]})" for name, args, _ in calls]
    if streak >= STOP_AFTER:
        return LoopVerdict("stop", streak, repeated)
    if streak == NUDGE_AFTER:
        return LoopVerdict("nudge", streak, repeated)
    return LoopVerdict("", streak, repeated)


def loop_nudge(verdict: LoopVerdict) -> str:
    """What the model is told when it repeats itself."""
    return (
        f"You have made the same call(s) and got the same result {verdict.stale_turns} turns "
        f"in a row ({'; '.join(verdict.repeated)[:400]}). Repeating them will not tell you "
        "anything new. If the change is done, run the tests and call finish; otherwise try "
        f"a different approach. After {STOP_AFTER} such turns the loop is stopped and the "
        "working copy is submitted as it is."
    )
