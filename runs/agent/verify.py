"""Verification outcome classification and the feedback summary sent back to the model."""

from __future__ import annotations

import re

from runs.agent.sandbox import CommandResult
from runs.models import VerificationAttempt

Outcome = VerificationAttempt.Outcome

_COMPILE_MARKERS = re.compile(
    r"SyntaxError|IndentationError|ImportError|ModuleNotFoundError|"
    r"error: (?:expected|cannot find|mismatched)|compilation (?:failed|terminated)|"
    r"error\[E\d+\]|TS\d{4}:|errors? during collection",
)


def verification_classify(result: CommandResult) -> str:
    if result.timed_out:
        return Outcome.TIMEOUT
    if result.exit_code == 0:
        return Outcome.PASSED
    if _COMPILE_MARKERS.search(result.output):
        return Outcome.COMPILE_ERROR
    # pytest: 1 = tests failed; most runners use 1 for failures as well.
    if result.exit_code == 1:
        return Outcome.TEST_FAILURE
    return Outcome.ERRORED


def verification_summary(output: str, *, max_lines: int = 60) -> str:
    """The part of a test log a model needs: failures and the tail."""
    lines = output.splitlines()
    interesting = [
        line for line in lines if re.search(r"FAILED|ERROR|Error|assert|Traceback|^E ", line)
    ]
    tail = lines[-max_lines:]
    picked = [*interesting[: max_lines // 2], "...", *tail] if interesting else tail
    return "\n".join(picked)[-6000:]
