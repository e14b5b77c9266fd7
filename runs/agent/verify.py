"""Verification outcome classification and the feedback summary sent back to the model."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

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


@dataclass(frozen=True)
class SuiteCounts:
    """How many tests a run of the test command reported: run (not skipped or
    deselected), passed, and failed or errored."""

    ran: int
    passed: int
    failed: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


# pytest's last line: "==== 1 failed, 2 passed, 1 skipped in 0.12s ====" (or -q's bare
# "1 failed, 2 passed in 0.12s"); "no tests ran in 0.01s".
_PYTEST_SUMMARY = re.compile(
    r"^=*\s*(?P<counts>\d+ [a-z][a-z ]*(?:, \d+ [a-z][a-z ]*)*|no tests ran)"
    r"(?: in [\d.]+s(?: \([\d:.]+\))?)\s*=*\s*$",
    re.MULTILINE,
)
_PYTEST_COUNT = re.compile(r"^(\d+) ([a-z]+)$")
# unittest: "Ran 3 tests in 0.001s", then "OK", "OK (skipped=1)" or "FAILED (failures=1)".
_UNITTEST_RAN = re.compile(
    r"^Ran (?P<ran>\d+) tests? in [\d.]+s\s*\n\s*\n(?P<result>OK|FAILED|NO TESTS RAN)"
    r"(?: \((?P<details>[^)]*)\))?\s*$",
    re.MULTILINE,
)


def _pytest_counts(output: str) -> SuiteCounts | None:
    found = None
    for match in _PYTEST_SUMMARY.finditer(output):
        counts: dict[str, int] = {}
        for part in match.group("counts").split(", "):
            number = _PYTEST_COUNT.match(part)
            if number:
                word = number.group(2)
                counts[word] = counts.get(word, 0) + int(number.group(1))
        failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
        passed = counts.get("passed", 0)
        ran = passed + failed + counts.get("xfailed", 0) + counts.get("xpassed", 0)
        found = _add(found, SuiteCounts(ran=ran, passed=passed, failed=failed))
    return found


def _unittest_counts(output: str) -> SuiteCounts | None:
    found = None
    for match in _UNITTEST_RAN.finditer(output):
        details: dict[str, int] = {}
        for item in (match.group("details") or "").split(","):
            name, _, value = item.strip().partition("=")
            if value.isdigit():
                details[name] = int(value)
        total = int(match.group("ran"))
        skipped = details.get("skipped", 0)
        failed = details.get("failures", 0) + details.get("errors", 0)
        unexpected = details.get("unexpected successes", 0)
        expected = details.get("expected failures", 0)
        passed = max(0, total - skipped - failed - unexpected - expected)
        found = _add(found, SuiteCounts(ran=max(0, total - skipped), passed=passed, failed=failed))
    return found


def _add(total: SuiteCounts | None, more: SuiteCounts) -> SuiteCounts:
    # A command may run several suites (make test); each reports its own summary.
    if total is None:
        return more
    return SuiteCounts(total.ran + more.ran, total.passed + more.passed, total.failed + more.failed)


def suite_counts_parse(output: str) -> SuiteCounts | None:
    """The counts the runner reported (pytest's summary line, unittest's "Ran N tests"
    and its result line), None when the output says neither."""
    counts = [c for c in (_pytest_counts(output), _unittest_counts(output)) if c is not None]
    if not counts:
        return None
    total = counts[0]
    for more in counts[1:]:
        total = _add(total, more)
    return total


def baseline_shortfall(*, base: SuiteCounts | None, patched: SuiteCounts | None) -> str | None:
    """Why the patch's run falls short of the base commit's (None when it does not):
    fewer tests run, fewer passed, or no count at all where the base had one.

    Tests that failed on the base and pass with the patch are what a fix does; a test
    the patch adds makes the counts larger, never a shortfall."""
    if base is None:
        return None
    if patched is None:
        return (
            f"the test output no longer says how many tests ran (on the base commit "
            f"{base.ran} ran and {base.passed} passed)"
        )
    if patched.ran < base.ran:
        return (
            f"fewer tests ran than on the base commit: {patched.ran} of {base.ran} "
            "(tests skipped, deselected, not collected or removed)"
        )
    if patched.passed < base.passed:
        return f"fewer tests passed than on the base commit: {patched.passed} of {base.passed}"
    return None
