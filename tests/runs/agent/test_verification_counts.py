"""The counts a test run reports, and when they fall short of the base commit's."""

from __future__ import annotations

import pytest

from runs.agent.verify import SuiteCounts, baseline_shortfall, suite_counts_parse

pytestmark = pytest.mark.no_services

UNITTEST_FAILED = (
    "F.s\n" + "=" * 70 + "\nFAIL: test_add\n" + "-" * 70 + "\n"
    "Ran 4 tests in 0.002s\n\nFAILED (failures=1, skipped=1, expected failures=1)\n"
)


@pytest.mark.parametrize(
    ("output", "counts"),
    [
        ("..\n" + "-" * 70 + "\nRan 2 tests in 0.001s\n\nOK\n", SuiteCounts(2, 2, 0)),
        (UNITTEST_FAILED, SuiteCounts(ran=3, passed=1, failed=1)),
        ("Ran 2 tests in 0.0s\n\nOK (skipped=2)\n", SuiteCounts(0, 0, 0)),
        ("Ran 0 tests in 0.000s\n\nNO TESTS RAN\n", SuiteCounts(0, 0, 0)),
        ("F.\n1 failed, 1 passed in 0.05s\n", SuiteCounts(2, 1, 1)),
        ("===== 1 failed, 2 passed, 1 skipped, 1 xfailed in 1.2s =====", SuiteCounts(4, 2, 1)),
        ("== 3 passed, 2 subtests passed, 1 warning in 61.0s (0:01:01) ==", SuiteCounts(3, 3, 0)),
        ("=== 2 deselected in 0.01s ===", SuiteCounts(0, 0, 0)),
        ("no tests ran in 0.01s", SuiteCounts(0, 0, 0)),
        ("== 1 error in 0.1s ==", SuiteCounts(1, 0, 1)),
        # make test running two suites: both count
        ("2 passed in 0.1s\nRan 3 tests in 0.1s\n\nOK\n", SuiteCounts(5, 5, 0)),
        ("all good\n", None),
    ],
)
def test_runner_summaries_are_counted(output, counts):
    assert suite_counts_parse(output) == counts


def test_a_fix_of_a_failing_test_and_a_new_test_are_not_a_shortfall():
    base = SuiteCounts(ran=2, passed=1, failed=1)
    assert baseline_shortfall(base=base, patched=SuiteCounts(2, 2, 0)) is None
    assert baseline_shortfall(base=base, patched=SuiteCounts(3, 3, 0)) is None


def test_fewer_tests_run_or_passed_or_no_count_at_all_is_a_shortfall():
    base = SuiteCounts(ran=2, passed=1, failed=1)
    assert "fewer tests ran" in baseline_shortfall(base=base, patched=SuiteCounts(1, 1, 0))
    assert "fewer tests ran" in baseline_shortfall(base=base, patched=SuiteCounts(0, 0, 0))
    assert "fewer tests passed" in baseline_shortfall(base=base, patched=SuiteCounts(2, 0, 1))
    assert "no longer says" in baseline_shortfall(base=base, patched=None)


def test_without_a_base_count_there_is_nothing_to_compare():
    assert baseline_shortfall(base=None, patched=None) is None
    assert baseline_shortfall(base=None, patched=SuiteCounts(0, 0, 0)) is None
