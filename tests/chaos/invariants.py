"""The invariants, read from the database (and, for side effects outside it, from the
local GitHub server that received them) once a scenario's work has drained.

- every accepted task and webhook delivery reaches a terminal state within the bound;
- no gap in a run's event sequence;
- at most one pull request per task, and no two tasks sharing a PR number;
- every consumer side effect exactly once: the cost ledger counts every model turn once,
  and every task from a GitHub issue gets one completion comment;
- no model turn asked again after it was checkpointed: every request the model endpoint
  received names its turn (run:step:turn), and none arrived after that turn's checkpoint
  committed (PostgreSQL's commit timestamp of the turn's row);
- no 5xx answer for work that was stored;
- every failure has a reason code;
- no process exits unless the harness killed it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tests.chaos.load import Load
from tests.chaos.modelserver import PROFILE

T = TypeVar("T")
TASK_TERMINAL = {"completed", "failed", "cancelled", "rejected"}
RUN_TERMINAL = {"completed", "failed", "cancelled", "timed_out"}
RECEIPT_TERMINAL = {"processed", "ignored", "failed"}
# Task end events the source-notification consumer answers with one comment each.
COMMENTED_STATUSES = {"completed", "failed", "cancelled"}


def db(query: Callable[[], T], attempts: int = 30) -> T:
    """Run ``query``; on a connection error (a restarted database) reconnect and retry."""
    from django.db import connection
    from django.db.utils import Error as DatabaseError

    for attempt in range(attempts):
        try:
            return query()
        except DatabaseError:
            connection.close()
            if attempt == attempts - 1:
                raise
            time.sleep(1)
    raise AssertionError("unreachable")


@dataclass
class Findings:
    runs: int = 0
    tasks: int = 0
    lost: int = 0
    duplicated: int = 0
    stuck: int = 0
    # Failed runs (run, reason and detail) and dead letters (task, args and exception).
    failures: list[str] = field(default_factory=list)
    letters: list[str] = field(default_factory=list)
    model_requests: int = 0
    model_reasked: int = 0  # requests of a turn before its checkpoint (a killed asker)
    violations: list[str] = field(default_factory=list)

    @property
    def failed_runs(self) -> int:
        return len(self.failures)

    @property
    def dead_letters(self) -> int:
        return len(self.letters)

    def add(self, kind: str, count: int, evidence: str) -> None:
        if count <= 0:
            return
        if kind == "lost":
            self.lost += count
        elif kind == "duplicated":
            self.duplicated += count
        elif kind == "stuck":
            self.stuck += count
        self.violations.append(f"{kind}: {evidence}")


def progress(load: Load) -> dict[str, Any]:
    """How much of the scope's work is still moving (used to wait for the drain)."""
    from jobs.models import OutboxEvent
    from runs.models import Task
    from webhooks.models import WebhookReceipt

    workspace_id = load.scope.workspace_id
    return {
        "tasks_open": Task.objects.filter(workspace_id=workspace_id)
        .exclude(status__in=TASK_TERMINAL)
        .count(),
        "receipts_open": WebhookReceipt.objects.filter(
            delivery_id__in=[d.delivery_id for d in load.deliveries if d.accepted],
            status="received",
        ).count(),
        "outbox_pending": OutboxEvent.objects.filter(published_at__isnull=True).count(),
        "ledger_behind": _ledger(workspace_id)[0] - _ledger(workspace_id)[1],
        "comments_missing": _comments_missing(load),
    }


def drained(state: dict[str, Any]) -> bool:
    return not any(state.values())


def work_open(state: dict[str, Any]) -> bool:
    """Tasks or deliveries not yet at an end (consumers may still be catching up)."""
    return bool(state["tasks_open"] or state["receipts_open"])


def wait_drained(load: Load, bound: float, tick: Callable[[], None]) -> float:
    """Seconds until the scope's work drained, or ``bound`` if it never did."""
    started = time.monotonic()
    while time.monotonic() - started < bound:
        tick()
        if drained(db(lambda: progress(load))):
            return time.monotonic() - started
        time.sleep(1)
    return bound


def _ledger(workspace_id: int) -> tuple[int, int]:
    """(model turns stored, model turns the cost ledger counted)."""
    from django.db.models import Sum

    from jobs.models import WorkspaceDailyCost
    from runs.models import ModelTurn

    turns = ModelTurn.objects.filter(run__task__workspace_id=workspace_id).count()
    counted = (
        WorkspaceDailyCost.objects.filter(workspace_id=workspace_id).aggregate(
            total=Sum("model_turns")
        )["total"]
        or 0
    )
    return turns, counted


def _webhook_tasks(load: Load) -> dict[int, list[Any]]:
    from runs.models import Task

    by_issue: dict[int, list[Any]] = {}
    for task in Task.objects.filter(workspace_id=load.scope.workspace_id, source="webhook"):
        number = int((task.source_ref or {}).get("issue_number") or 0)
        by_issue.setdefault(number, []).append(task)
    return by_issue


def _comments_for(load: Load) -> dict[int, int]:
    _, comments = load.stack.github.snapshot()
    return {
        number: len(found)
        for (repo, number), found in comments.items()
        if repo == load.scope.github_repository
    }


def _comments_missing(load: Load) -> int:
    comments = _comments_for(load)
    missing = 0
    for number, tasks in _webhook_tasks(load).items():
        if any(t.status in COMMENTED_STATUSES for t in tasks) and not comments.get(number):
            missing += 1
    return missing


def check(load: Load, *, exits: list[str]) -> Findings:
    return db(lambda: _check(load, exits))


def _check(load: Load, exits: list[str]) -> Findings:
    from jobs.models import DeadLetter
    from runs.models import Run, Task

    found = Findings()
    workspace_id = load.scope.workspace_id
    tasks = list(Task.objects.filter(workspace_id=workspace_id))
    runs = list(Run.objects.filter(task__workspace_id=workspace_id))
    found.tasks, found.runs = len(tasks), len(runs)
    by_issue = _webhook_tasks(load)
    _submissions_check(found, load, tasks)
    _deliveries_check(found, load, by_issue)
    _runs_check(found, workspace_id, runs)
    _model_turns_check(found, load, tasks, runs)
    _endpoint_check(found, workspace_id, {str(run.pk) for run in runs}, load)
    _pull_requests_check(found, load)
    _consumers_check(found, load, by_issue)
    letters = list(DeadLetter.objects.filter(workspace_id=workspace_id).order_by("created_at"))
    found.letters = [
        f"{letter.task_name} {letter.args}: {' '.join(letter.exception.split())[:300]}"
        for letter in letters
    ]
    found.violations.extend(f"exit: {e}" for e in exits)
    return found


def _submissions_check(found: Findings, load: Load, tasks: list[Any]) -> None:
    # Accepted submissions: exactly one task each, terminal; 5xx never for stored work.
    by_marker = Counter(t.instruction.split(" ", 1)[0] for t in tasks if t.source == "api")
    for sub in load.submissions:
        stored = by_marker.get(sub.marker, 0)
        if sub.accepted and stored == 0:
            found.add("lost", 1, f"submission {sub.marker} answered 202, no task stored")
        if stored > 1:
            found.add("duplicated", stored - 1, f"submission {sub.marker} stored {stored} times")
        if sub.status is not None and sub.status >= 500 and stored:
            found.violations.append(
                f"5xx: submission {sub.marker} answered {sub.status} but the task was stored"
            )
    for task in tasks:
        if task.status not in TASK_TERMINAL:
            found.add("stuck", 1, f"task {task.id} ({task.instruction[:24]}) is {task.status}")
        if task.status in {"failed", "rejected"} and not task.status_reason:
            found.violations.append(f"no reason: task {task.id} {task.status} without a reason")


def _deliveries_check(found: Findings, load: Load, by_issue: dict[int, list[Any]]) -> None:
    from webhooks.models import WebhookReceipt

    # Accepted deliveries: a terminal receipt, one task per labelled issue.
    receipts = {
        r.delivery_id: r
        for r in WebhookReceipt.objects.filter(
            delivery_id__in=[d.delivery_id for d in load.deliveries]
        )
    }
    for delivery in load.deliveries:
        receipt = receipts.get(delivery.delivery_id)
        if not delivery.accepted:
            continue
        if receipt is None:
            found.add("lost", 1, f"delivery {delivery.delivery_id} answered 2xx, no receipt")
            continue
        if receipt.status == "received":
            found.add("stuck", 1, f"delivery {delivery.delivery_id} still received")
            continue
        if receipt.status == "failed":
            found.add("lost", 1, f"delivery {delivery.delivery_id} failed: {receipt.error[:120]}")
            if not (receipt.error or receipt.status_reason):
                found.violations.append(f"no reason: receipt {receipt.pk} failed")
            continue
        issued = len(by_issue.get(delivery.issue_number, []))
        if issued == 0:
            found.add(
                "lost",
                1,
                f"delivery {delivery.delivery_id} {receipt.status} "
                f"({receipt.status_reason[:80]}) but issue {delivery.issue_number} has no task",
            )
    for number, issue_tasks in by_issue.items():
        if len(issue_tasks) > 1:
            found.add(
                "duplicated", len(issue_tasks) - 1, f"issue {number}: {len(issue_tasks)} tasks"
            )


def _runs_check(found: Findings, workspace_id: int, runs: list[Any]) -> None:
    from django.db import connection

    # Runs: terminal, gap-free timelines, reasons for failures.
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT r.id, count(e.id),
                   coalesce(max(e.sequence_no), 0), coalesce(min(e.sequence_no), 1)
            FROM runs_run r JOIN runs_task t ON t.id = r.task_id
            LEFT JOIN runs_runevent e ON e.run_id = r.id
            WHERE t.workspace_id = %s GROUP BY r.id
            """,
            [workspace_id],
        )
        for run_id, count, highest, lowest in cursor.fetchall():
            if count != highest or lowest != 1:
                found.violations.append(
                    f"sequence gap: run {run_id} has {count} events numbered {lowest}..{highest}"
                )
    for run in runs:
        if run.status not in RUN_TERMINAL:
            found.add("stuck", 1, f"run {run.id} is {run.status}")
        if run.status in {"failed", "timed_out"}:
            detail = " ".join((run.failure_detail or "").split())[:300]
            found.failures.append(f"run {run.id} {run.status}: {run.failure_reason}: {detail}")
            if not run.failure_reason:
                found.violations.append(f"no reason: run {run.id} {run.status} without a reason")


def _model_turns_check(found: Findings, load: Load, tasks: list[Any], runs: list[Any]) -> None:
    from django.db.models import Count

    from runs.models import ModelTurn, RunEvent

    workspace_id = load.scope.workspace_id
    # Model turns: the checkpoint answers a re-executed turn, so a completed run of the
    # scripted agent holds exactly its script's turns (the plan and each act turn) and
    # one completion event per turn; a turn asked again shows up as one more.
    turns = ModelTurn.objects.filter(run__task__workspace_id=workspace_id).count()
    turn_events = RunEvent.objects.filter(
        run__task__workspace_id=workspace_id, type="agent.model.turn.completed"
    ).count()
    if turn_events != turns:
        found.add(
            "duplicated",
            abs(turn_events - turns),
            f"model turns asked again: {turn_events} turn events for {turns} checkpointed turns",
        )
    counts = dict(
        ModelTurn.objects.filter(run__task__workspace_id=workspace_id)
        .values_list("run_id")
        .annotate(n=Count("id"))
    )
    tasks_by_id = {t.pk: t for t in tasks}
    for run in runs:
        options = tasks_by_id[run.task_id].model_options or {}
        script = options.get("script") or (
            load.stack.model.script if options.get("profile") == PROFILE else {}
        )
        if run.status != "completed" or run.retries or "turns" not in script:
            continue
        expected = 1 + len(script["turns"])
        if counts.get(run.pk, 0) > expected:
            found.add(
                "duplicated",
                counts[run.pk] - expected,
                f"run {run.id}: {counts[run.pk]} model turns for a {expected}-turn script",
            )


def _pull_requests_check(found: Findings, load: Load) -> None:
    from runs.models import PullRequest

    workspace_id = load.scope.workspace_id
    # Pull requests: one per task in the database and at the GitHub server, unique numbers.
    prs = list(PullRequest.objects.filter(task__workspace_id=workspace_id))
    for task_id, count in Counter(pr.task_id for pr in prs).items():
        if count > 1:
            found.add("duplicated", count - 1, f"task {task_id} has {count} pull requests")
    numbers = Counter((pr.task.repository_id, pr.number) for pr in prs if pr.number is not None)
    for (repository_id, number), count in numbers.items():
        if count > 1:
            found.add(
                "duplicated",
                count - 1,
                f"PR number {number} of repository {repository_id} given to {count} tasks",
            )
    pulls, _ = load.stack.github.snapshot()
    per_branch = Counter(
        p["head"]["ref"] for p in pulls if p["repo"] == load.scope.github_repository
    )
    for branch, count in per_branch.items():
        if count > 1:
            found.add("duplicated", count - 1, f"GitHub has {count} pull requests for {branch}")


def _consumers_check(found: Findings, load: Load, by_issue: dict[int, list[Any]]) -> None:
    stored, counted = _ledger(load.scope.workspace_id)
    # Consumers: the ledger counts each model turn once; one comment per issue task.
    if counted > stored:
        found.add("duplicated", counted - stored, f"cost ledger {counted} turns for {stored}")
    elif counted < stored:
        found.add("lost", stored - counted, f"cost ledger {counted} turns for {stored}")
    comments = _comments_for(load)
    for number, issue_tasks in by_issue.items():
        expected = 1 if any(t.status in COMMENTED_STATUSES for t in issue_tasks) else 0
        got = comments.get(number, 0)
        if got > expected:
            found.add("duplicated", got - expected, f"issue {number}: {got} completion comments")
        elif got < expected:
            found.add("lost", expected - got, f"issue {number}: no completion comment")


def _endpoint_check(found: Findings, workspace_id: int, run_ids: set[str], load: Load) -> None:
    """At the model endpoint: no turn requested after its checkpoint committed."""
    from django.db import connection

    everything = load.stack.model.requests()
    unnamed = sum(1 for r in everything if not r.key)
    if unnamed:
        found.violations.append(f"endpoint: {unnamed} model requests named no turn")
    requests = [r for r in everything if r.key.split(":", 1)[0] in run_ids]
    found.model_requests = len(requests)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT mt.run_id, mt.step_no, mt.turn_no,
                   extract(epoch FROM pg_xact_commit_timestamp(mt.xmin))
            FROM runs_modelturn mt JOIN runs_run r ON r.id = mt.run_id
            JOIN runs_task t ON t.id = r.task_id WHERE t.workspace_id = %s
            """,
            [workspace_id],
        )
        committed = {f"{run}:{step}:{turn}": at for run, step, turn, at in cursor.fetchall()}
    asked = Counter(r.key for r in requests)
    found.model_reasked = sum(n - 1 for key, n in asked.items() if key in committed and n > 1)
    for request in requests:
        at = committed.get(request.key)
        if at is not None and request.at > float(at):
            found.add(
                "duplicated",
                1,
                f"model turn {request.key} ({request.position}) requested at the endpoint "
                f"{request.at - float(at):.3f}s after its checkpoint committed",
            )
    never = [key for key in committed if key not in asked]
    if never:
        found.violations.append(
            f"endpoint: {len(never)} checkpointed turns never requested, e.g. {never[0]}"
        )


def active_runs(workspace_id: int) -> list[str]:
    """Runs holding a lease right now: the work a fault interrupts."""
    from django.utils import timezone

    from runs.models import Run

    return [
        str(pk)
        for pk in Run.objects.filter(
            task__workspace_id=workspace_id, lease_until__gt=timezone.now()
        )
        .exclude(status__in=RUN_TERMINAL)
        .values_list("id", flat=True)
    ]


def recovery_seconds(run_ids: list[str], since: float) -> float:
    """How long the slowest of ``run_ids`` took to show progress after ``since`` (epoch
    seconds): its next timeline event, or its end."""
    from datetime import UTC, datetime

    from django.db.models import Min

    from runs.models import RunEvent

    if not run_ids:
        return 0.0
    moment = datetime.fromtimestamp(since, tz=UTC)
    firsts = (
        RunEvent.objects.filter(run_id__in=run_ids, created_at__gt=moment)
        .values("run_id")
        .annotate(first=Min("created_at"))
    )
    seen = {str(row["run_id"]): row["first"].timestamp() - since for row in firsts}
    return max(seen.get(run_id, time.time() - since) for run_id in run_ids)
