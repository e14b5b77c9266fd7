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
) -> Verdict:
    """Deterministic checks; any block finding blocks, any revise finding asks for rework."""
    findings: list[dict[str, Any]] = []
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
    if scope:
        outside = [f for f in files if not any(fnmatch.fnmatchcase(f, g) for g in scope)]
        if outside:
            findings.append({"rule": "out_of_scope", "severity": "revise", "paths": outside})
    if any(f["severity"] == "block" for f in findings):
        return Verdict("block", findings)
    if findings:
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
