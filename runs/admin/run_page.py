"""The run page's content: the timeline by phase, diffs, findings and budgets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count
from django.utils import timezone

from jobs.admin.console import age_text, status_badge
from runs.agent.budget import budget_used
from runs.models import Approval, Artifact, Run, RunEvent
from runs.state import ACTIVE, TERMINAL
from runs.waiting import input_pending

TIMELINE_LIMIT = 2000
ARTIFACT_DISPLAY_LIMIT = 200_000

S = Run.Status

# The phase a run is in while it has a status; the run page groups its timeline by it.
PHASE_OF_STATUS: dict[str, str] = {
    S.QUEUED: "setup",
    S.PREPARING: "setup",
    S.CONTEXT_LOADING: "setup",
    S.PLANNING: "planning",
    S.RUNNING: "editing",
    S.VERIFYING: "verification",
    S.JUDGING: "judging",
    S.AWAITING_APPROVAL: "approval",
    S.AWAITING_INPUT: "input",
    S.CREATING_PR: "PR",
    S.COMPLETED: "outcome",
    S.FAILED: "outcome",
    S.CANCELLED: "outcome",
    S.TIMED_OUT: "outcome",
}


# --- the run page's content ---------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    events: list[RunEvent] = field(default_factory=list)


@dataclass
class Budget:
    name: str
    used: float
    limit: float
    unit: str = ""

    @property
    def percent(self) -> int:
        if self.limit <= 0:
            return 0
        return min(100, round(self.used / self.limit * 100))

    @property
    def tone(self) -> str:
        return "bad" if self.percent >= 90 else "warn" if self.percent >= 70 else "ok"

    @property
    def label(self) -> str:
        if self.unit == "$":
            return f"${self.used:.4f} of ${self.limit:.2f}"
        if self.unit == "s":
            return f"{age_text(self.used)} of {age_text(self.limit)}"
        return f"{self.used:g} of {self.limit:g}"


def timeline_phases(events: list[RunEvent]) -> list[Phase]:
    """Group events by the phase the run was in when each happened, in sequence order.

    A step's events are recorded before the status change that ends it, so the status
    is updated after an ``agent.run.status.changed`` event is placed.
    """
    phases: list[Phase] = []
    status = S.QUEUED
    for event in events:
        if event.type == "agent.run.status.changed":
            status = event.data.get("to", status)
        name = PHASE_OF_STATUS.get(status, status)
        if not phases or phases[-1].name != name:
            phases.append(Phase(name))
        phases[-1].events.append(event)
    return phases


def diff_lines(text: str) -> list[tuple[str, str]]:
    """Each diff line with its CSS class (add, del, hunk, file, ctx)."""
    lines = []
    for line in text.splitlines():
        if line.startswith(("+++", "---", "diff --git", "index ")):
            tone = "file"
        elif line.startswith("@@"):
            tone = "hunk"
        elif line.startswith("+"):
            tone = "add"
        elif line.startswith("-"):
            tone = "del"
        else:
            tone = "ctx"
        lines.append((tone, line))
    return lines


def _artifact_text(artifact: Artifact | None) -> str:
    if artifact is None:
        return ""
    text = artifact.content
    if len(text) > ARTIFACT_DISPLAY_LIMIT:
        return text[:ARTIFACT_DISPLAY_LIMIT] + f"\n… ({len(text)} characters, truncated)"
    return text


def finding_text(finding: Any) -> str:
    """One judge finding as a line: ``[severity] rule: message (other fields)``."""
    if not isinstance(finding, dict):
        return str(finding)
    rest = {k: v for k, v in finding.items() if k not in ("severity", "rule", "message")}
    text = f"[{finding.get('severity', 'info')}] {finding.get('rule', 'finding')}"
    if finding.get("message"):
        text += f": {finding['message']}"
    if rest:
        text += " (" + ", ".join(f"{k}={v}" for k, v in rest.items()) + ")"
    return text


def run_budgets(run: Run) -> list[Budget]:
    """Usage against each of the task's budgets: cumulative over its runs, as enforced."""
    task = run.task
    usage = task.usage or {}
    checkpoint = run.checkpoint or {}
    end = run.finished_at or timezone.now()
    wall = (
        (end - (run.started_at or run.created_at)).total_seconds()
        if run.status not in TERMINAL
        else 0.0
    )
    turns = task.runs.aggregate(n=Count("model_turns"))["n"] or 0
    return [
        Budget(
            "cost",
            float(usage.get("cost_usd", 0)) + float(run.cost_usd),
            task.budget_limit("cost_usd"),
            "$",
        ),
        Budget("model turns", float(turns), task.budget_limit("model_turns")),
        Budget(
            "agent attempts",
            budget_used(task=task, run=run, name="agent_attempts"),
            task.budget_limit("agent_attempts"),
        ),
        Budget(
            "tool failures",
            float(checkpoint.get("tool_failures", 0)),
            task.budget_limit("tool_retries"),
        ),
        Budget(
            "wall clock",
            float(usage.get("wall_clock_seconds", 0)) + wall,
            task.budget_limit("wall_clock_seconds"),
            "s",
        ),
    ]


def run_console(run: Run) -> dict[str, Any]:
    """Everything the run page shows, in a bounded number of queries."""
    events = list(run.events.order_by("sequence_no")[:TIMELINE_LIMIT])
    patches = list(run.patches.select_related("diff_artifact").order_by("attempt_no"))
    verifications = list(
        run.verifications.select_related("log_artifact", "patch").order_by("created_at")
    )
    approvals = list(run.approvals.select_related("patch__diff_artifact").order_by("requested_at"))
    pending = next((a for a in approvals if a.status == Approval.Status.PENDING), None)
    return {
        "run": run,
        "status_badge": status_badge(run.status),
        "phases": timeline_phases(events),
        "events_truncated": run.last_sequence_no > len(events),
        "tool_calls": list(run.tool_calls.order_by("step_no", "turn_no", "id")),
        "artifacts": list(
            run.artifacts.order_by("created_at").only(
                "id", "run_id", "kind", "name", "size_bytes", "created_at"
            )[:500]
        ),
        "model_turns": list(run.model_turns.order_by("step_no", "turn_no")),
        "patches": [
            {"patch": p, "lines": diff_lines(_artifact_text(p.diff_artifact))} for p in patches
        ],
        "verifications": [
            {"verification": v, "log": _artifact_text(v.log_artifact)} for v in verifications
        ],
        "judgements": [
            {"judgement": j, "findings": [finding_text(f) for f in j.findings or []]}
            for j in run.judgements.select_related("patch").order_by("created_at")
        ],
        "approvals": approvals,
        "pending_approval": (
            {"approval": pending, "lines": diff_lines(_artifact_text(pending.patch.diff_artifact))}
            if pending is not None
            else None
        ),
        "pull_requests": list(run.task.pull_requests.all()),
        "budgets": run_budgets(run),
        "totals": {"tokens_in": run.tokens_in, "tokens_out": run.tokens_out, "cost": run.cost_usd},
        "is_active": run.status in ACTIVE,
        "awaiting_approval": run.status == S.AWAITING_APPROVAL,
        "input_requests": list(run.input_requests.order_by("requested_at")),
        "pending_input": input_pending(run),
        "lease_expired": bool(
            run.lease_until and run.lease_until < timezone.now() and run.status in ACTIVE
        ),
    }
