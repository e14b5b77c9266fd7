"""The judge: rule checks on the patch, plus an optional model judge."""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from typing import Any

from runs.agent.tools import path_is_forbidden

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
