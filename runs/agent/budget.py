"""Task budgets: what a task may spend across all of its runs.

Usage is counted from the rows a run leaves behind (model turns, tool calls, patches),
never from counters kept in a run's checkpoint. Those rows are written in the same
transactions that checkpoint the work, so the count is cumulative over follow-up runs
and a crash recovery cannot reset it: a replayed turn is a row that already exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import Sum
from django.utils import timezone

from runs.models import Approval, InputRequest, ModelTurn, Patch, Run, Task, ToolCall
from runs.protocol import StepContext, StepFailed

S = Run.Status

# budget name -> (reason code when exhausted, run status it ends in)
BUDGETS: dict[str, tuple[str, str]] = {
    "agent_attempts": ("budget_agent_attempts", S.FAILED),
    "model_turns": ("budget_model_turns", S.FAILED),
    "tool_retries": ("budget_tool_retries", S.FAILED),
    "wall_clock_seconds": ("budget_wall_clock", S.TIMED_OUT),
    "cost_usd": ("budget_cost", S.FAILED),
    "model_errors": ("budget_model_errors", S.FAILED),
}
# A call that was refused or crashed is a retry; a command that ran and exited non-zero
# is information for the model and is not counted.
FAILED_TOOL_STATUSES = (ToolCall.Status.DENIED, ToolCall.Status.FAILED, ToolCall.Status.TIMED_OUT)


@dataclass
class Spent:
    name: str
    used: float
    limit: float


def run_working_seconds(run: Run, *, now: datetime | None = None) -> float:
    """Seconds the run has existed minus the time it waited for a person: approvals and
    answers to its questions (plan reviews included).

    Waiting for a person is not work: it may take days, the budget is for the agent's
    own time.
    """
    now = now or timezone.now()
    started = run.started_at or run.created_at
    # Set by the step's lease statement when the run had never waited at the step's
    # start: only the step's own commit can add a wait, and it has not been waited yet.
    if getattr(run, "approvals_none", False):
        return max(0.0, (now - started).total_seconds())
    waits = [
        *Approval.objects.filter(run_id=run.pk).values_list("requested_at", "decided_at"),
        *InputRequest.objects.filter(run_id=run.pk).values_list("requested_at", "answered_at"),
    ]
    waited = 0.0
    for requested, decided in waits:
        begin = max(requested, started)
        end = min(decided or now, now)
        if end > begin:
            waited += (end - begin).total_seconds()
    return max(0.0, (now - started).total_seconds() - waited)


def budget_used(*, task: Task, run: Run, name: str) -> float:
    """How much of budget ``name`` the task has used, this run included."""
    if name == "agent_attempts":
        return float(Patch.objects.filter(run__task=task).count())
    if name == "model_turns":
        return float(ModelTurn.objects.filter(run__task=task).count())
    if name == "tool_retries":
        return float(
            ToolCall.objects.filter(run__task=task, status__in=FAILED_TOOL_STATUSES).count()
        )
    if name == "model_errors":
        return float(ModelTurn.objects.filter(run__task=task).exclude(problem="").count())
    if name == "cost_usd":
        if run.run_no == 1:
            # The task's only run so far: its running total (kept with every model turn,
            # in the turn's transaction) is the task's, without a query per step.
            return float(run.cost_usd or 0)
        total = ModelTurn.objects.filter(run__task=task).aggregate(c=Sum("cost_usd"))["c"]
        return float(total or Decimal("0"))
    if name == "wall_clock_seconds":
        # Finished runs added their time to the task at their end; this one is running.
        earlier = float((task.usage or {}).get("wall_clock_seconds", 0))
        return earlier + run_working_seconds(run)
    raise ValueError(f"unknown budget {name!r}")


def budget_exhausted(ctx: StepContext, spent: Spent, *, detail: str = "") -> StepFailed:
    """Record the exhaustion on the timeline; returns the failure to raise."""
    reason, status = BUDGETS[spent.name]
    ctx.emit(
        "agent.budget.exhausted",
        {
            "budget": spent.name,
            "used": round(spent.used, 6),
            "limit": spent.limit,
            "reason": reason,
        },
    )
    return StepFailed(
        reason, detail or f"{spent.name}: used {spent.used:g} of {spent.limit:g}", status=status
    )


def budget_enforce(ctx: StepContext, *names: str, headroom: float = 0) -> None:
    """Fail the step if any named budget is spent.

    ``headroom`` is what the next action would add: a model call is refused when the
    turns already used plus the one about to be asked exceed the limit.
    """
    for name in names:
        limit = ctx.task.budget_limit(name)
        used = budget_used(task=ctx.task, run=ctx.run, name=name)
        if used + headroom > limit:
            raise budget_exhausted(ctx, Spent(name, used, limit))
