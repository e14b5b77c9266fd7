"""The judge: rule checks on the patch, plus an optional model judge."""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from typing import Any

from runs.agent.tool_policy import path_is_forbidden

DEFAULT_MAX_DIFF_LINES = 2000

SECRET_RULES: list[tuple[str, re.Pattern[str]]] = [
    ("private_key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    ("aws_access_key", re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("github_token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b")),
    ("gitlab_token", re.compile(r"\bglpat-[A-Za-z0-9_\-]{20,}\b")),
    ("openai_key", re.compile(r"\bsk-[A-Za-z0-9_\-]{32,}\b")),
    ("slack_token", re.compile(r"\bxox[baprs]-[A-Za-z0-9-]{10,}\b")),
    ("gcp_service_account", re.compile(r"\"type\":\s*\"service_account\"")),
]


# Where tests live, by the conventions of the common test runners.
TEST_PATH_PATTERNS = (
    "test/*",
    "tests/*",
    "*/test/*",
    "*/tests/*",
    "spec/*",
    "*/spec/*",
    "__tests__/*",
    "*/__tests__/*",
    "test_*.py",
    "*/test_*.py",
    "*_test.py",
    "*_test.go",
    "*Test.java",
    "*Tests.java",
    "*.test.[jt]s",
    "*.test.[jt]sx",
    "*.spec.[jt]s",
    "*.spec.[jt]sx",
    "*_spec.rb",
    "conftest.py",
    "*/conftest.py",
)
ASSERTION = re.compile(
    r"\b(assert\w*|expect|should|must|verify|require\.\w+|t\.(Error|Fatal)\w*)\b|@Test|pytest\.raises"
)


def is_test_path(path: str) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in TEST_PATH_PATTERNS)


def weakened_tests(diff_text: str) -> dict[str, Any] | None:
    """The ``tests_modified`` finding when the patch edits or deletes an existing test
    file, or removes an assertion anywhere; new test files alone are not a finding."""
    changed: list[str] = []
    removed_assertions = 0
    path = ""
    new_file = False
    for line in diff_text.splitlines():
        if line.startswith("diff --git "):
            path, new_file = line.split(" b/", 1)[-1], False
        elif line.startswith("new file mode"):
            new_file = True
        elif line.startswith("--- ") or line.startswith("+++ "):
            continue
        elif line.startswith(("-", "+")) and not new_file:
            if is_test_path(path) and path not in changed:
                changed.append(path)
            if line.startswith("-") and ASSERTION.search(line):
                removed_assertions += 1
    if not changed and not removed_assertions:
        return None
    return {
        "rule": "tests_modified",
        "severity": "flag",
        "paths": changed,
        "removed_assertions": removed_assertions,
    }


@dataclass
class Verdict:
    verdict: str  # accept | revise | block
    findings: list[dict[str, Any]] = field(default_factory=list)
    score: float | None = None


def judge_rules(
    *,
    diff_text: str,
    files: list[str],
    lines_changed: int,
    forbidden_paths: list[str],
    scope: list[str] | None = None,
    max_diff_lines: int = DEFAULT_MAX_DIFF_LINES,
    steering: list[dict[str, str]] | None = None,
) -> Verdict:
    """Deterministic checks; any block finding blocks, any revise finding asks for rework.

    ``steering``: the patch's files that can change how tests are found or run
    (runs.agent.steering); they become a ``test_configuration`` finding of severity
    ``approval``: the patch is not refused, but a human always decides."""
    findings: list[dict[str, Any]] = []
    if steering:
        findings.append({"rule": "test_configuration", "severity": "approval", "files": steering})
    for path in files:
        pattern = path_is_forbidden(path, forbidden_paths)
        if pattern:
            findings.append(
                {"rule": "forbidden_path", "severity": "block", "path": path, "pattern": pattern}
            )
    if lines_changed > max_diff_lines:
        findings.append(
            {
                "rule": "diff_size",
                "severity": "block",
                "lines": lines_changed,
                "limit": max_diff_lines,
            }
        )
    added = "\n".join(
        line[1:]
        for line in diff_text.splitlines()
        if line.startswith("+") and not line.startswith("+++")
    )
    for name, secret in SECRET_RULES:
        if secret.search(added):
            findings.append({"rule": "secret", "severity": "block", "kind": name})
    weakened = weakened_tests(diff_text)
    if weakened:
        # Not a verdict on its own: a patch may rightly change a test. Policy decides
        # whether a human must look (see TESTS_MODIFIED_REQUIRES_APPROVAL).
        findings.append(weakened)
    if scope:
        outside = [f for f in files if not any(fnmatch.fnmatchcase(f, g) for g in scope)]
        if outside:
            findings.append({"rule": "out_of_scope", "severity": "revise", "paths": outside})
    if any(f["severity"] == "block" for f in findings):
        return Verdict("block", findings)
    if any(f["severity"] == "revise" for f in findings):
        return Verdict("revise", findings)
    return Verdict("accept", findings)


_SEVERITY = {"accept": 0, "revise": 1, "block": 2}


def judge_model_parse(content: str) -> Verdict:
    """The model judge's answer as a Verdict; an unreadable answer is recorded, not trusted.

    An answer that cannot be read neither blocks nor accepts on its own: the rule
    checks decide, and the finding shows the model judge had nothing usable to say.
    """
    match = re.search(r"\{.*\}", content, re.DOTALL)
    try:
        data = json.loads(match.group(0)) if match else None
    except ValueError:
        data = None
    verdict = data.get("verdict") if isinstance(data, dict) else None
    if verdict not in _SEVERITY:
        return Verdict(
            "accept",
            [{"rule": "model_judge_unreadable", "severity": "info", "answer": content[:300]}],
        )
    assert isinstance(data, dict)
    raw_score = data.get("score")
    try:
        # float(None) raises TypeError too, so a missing score ends up as None.
        score: float | None = None if raw_score is None else min(1.0, max(0.0, float(raw_score)))
    except (TypeError, ValueError):
        score = None
    findings = []
    if verdict != "accept":
        findings.append(
            {
                "rule": "model_judge",
                "severity": verdict,
                "reasons": str(data.get("reasons", ""))[:1000],
            }
        )
    return Verdict(verdict, findings, score)


def verdict_combine(verdicts: list[Verdict]) -> Verdict:
    """The most severe verdict, carrying every finding and the lowest score."""
    worst = max(verdicts, key=lambda v: _SEVERITY[v.verdict])
    findings = [f for v in verdicts for f in v.findings]
    scores = [v.score for v in verdicts if v.score is not None]
    return Verdict(worst.verdict, findings, min(scores) if scores else None)


# A task asks for a fix when its type says so or its instruction does, and does not
# itself ask to remove, skip or disable tests.
FIX_TASK_TYPES = frozenset({"fix", "bugfix", "bug", "bug_fix", "repair", "ci_failure"})
FIX_WORDS = re.compile(
    r"\b(fix\w*|bugs?|broken|fail\w*|error\w*|crash\w*|regression|repair|wrong|incorrect)\b",
    re.IGNORECASE,
)
TESTS_REMOVAL_ASKED = re.compile(
    r"\b(remove|delete|drop|skip|disable|quarantine)\b[^.\n]{0,40}\b(tests?|specs?)\b"
    r"|\b(tests?|specs?)\b[^.\n]{0,40}\b(remove|delete|drop|skip|disable|quarantine)\b",
    re.IGNORECASE,
)
SKIP_MARK = re.compile(
    r"@pytest\.mark\.(skip|xfail)|pytest\.(skip|xfail)\(|@unittest\.(skip|expectedFailure)"
    r"|\.skipTest\(|\b(it|describe|test)\.(skip|todo)\(|\bx(it|describe|test)\(|t\.Skip"
    r"|@(Ignore|Disabled)\b|#\[ignore\]|\bskip\s*\(",
)
TEST_DEFINITION = re.compile(
    r"^\s*(async\s+)?def\s+test\w*|^\s*func\s+Test\w+|\b(it|test|describe)\s*\(|@Test\b"
    r"|#\[test\]|^\s*def\s+test_"
)


def task_asks_for_fix(*, instruction: str, task_type: str = "") -> bool:
    if TESTS_REMOVAL_ASKED.search(instruction):
        return False
    return task_type.lower() in FIX_TASK_TYPES or bool(FIX_WORDS.search(instruction))


def tests_weakened_only(diff_text: str) -> dict[str, Any] | None:
    """The ``tests_weakened`` finding when the patch changes nothing but tests and only
    makes them weaker: deletes test files or tests, removes assertions, adds skips.

    A patch like that cannot have fixed anything; it made the failure invisible.
    """
    paths: list[str] = []
    deleted: list[str] = []
    counts = {"removed_assertions": 0, "added_assertions": 0, "removed_tests": 0}
    counts["added_skips"] = 0
    path = ""
    for line in diff_text.splitlines():
        if line.startswith("diff --git "):
            path = line.split(" b/", 1)[-1]
            paths.append(path)
        elif line.startswith("deleted file mode"):
            deleted.append(path)
        elif line.startswith(("--- ", "+++ ")):
            continue
        elif line.startswith("-"):
            counts["removed_assertions"] += bool(ASSERTION.search(line))
            counts["removed_tests"] += bool(TEST_DEFINITION.search(line[1:]))
        elif line.startswith("+"):
            counts["added_assertions"] += bool(ASSERTION.search(line))
            counts["added_skips"] += bool(SKIP_MARK.search(line))
    if not paths or not all(is_test_path(p) for p in paths):
        return None
    weaker = (
        deleted
        or counts["added_skips"]
        or counts["removed_tests"] > 0
        or counts["removed_assertions"] > counts["added_assertions"]
    )
    if not weaker:
        return None
    return {
        "rule": "tests_weakened",
        "severity": "revise",
        "paths": paths,
        "deleted_files": deleted,
        **counts,
        "reason": (
            "The patch changes only tests, and only makes them weaker (removes tests or "
            "assertions, or skips them); the code they test is unchanged, so the failure "
            "is hidden, not fixed. Revert the test changes and fix the code instead."
        ),
    }
