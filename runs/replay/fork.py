"""Fork: a new run that starts where a recorded run stood after its model turn N.

The fork is a new Task (the original's instruction, repository and budget; execution
mode ``dry_run``, so an experiment never opens a pull request) whose ``source_ref``
names the run and turn it forks, and its first run. The recorded model turns 1..N
(counted over the run's turns in order, plan and judge included) are copied into the
new run as its own ModelTurn checkpoints under the same (step_no, turn_no) keys: the
agent loop takes a checkpointed answer instead of asking the model (runs.agent.turns),
and re-executes the tools they asked for on its own working copy, so it reaches turn N
in the state the original had and asks the model (the same profile or another) only
from turn N+1 on. Everything is written in the submission's transaction, before the
run's first wake-up, and ``agent.run.forked`` goes on both timelines.

Reused turns cost the fork nothing: their tokens and cost stay the original's, and the
fork's totals and timeline hold only what it asked itself. The fork clones the default
branch as it is when it starts, like any new task: if the branch moved since the
original's base commit, the reused turns' tools act on today's files (a replay's report
says whether they still give the recorded results). Follow-up runs are not forked.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from runs.agent.profiles import ProfileError, profile_get
from runs.models import Artifact, ModelTurn, Run, Task
from runs.services import CommandRefused, task_submit
from runs.state import TERMINAL
from runs.timeline import event_record


def _artifact_copy(artifact: Artifact | None, run: Run) -> Artifact | None:
    if artifact is None:
        return None
    return Artifact.objects.create(
        run=run,
        kind=artifact.kind,
        name=artifact.name,
        content_type=artifact.content_type,
        content=artifact.content,
        size_bytes=artifact.size_bytes,
        sha256=artifact.sha256,
    )


def _turns_seed(turns: list[ModelTurn], run: Run) -> None:
    for turn in turns:
        ModelTurn.objects.create(
            run=run,
            step_no=turn.step_no,
            turn_no=turn.turn_no,
            purpose=turn.purpose,
            provider=turn.provider,
            model=turn.model,
            response=turn.response,
            finish_reason=turn.finish_reason,
            problem=turn.problem,
            usage_estimated=turn.usage_estimated,
            request_artifact=_artifact_copy(turn.request_artifact, run),
            response_artifact=_artifact_copy(turn.response_artifact, run),
        )


def run_fork(*, run: Run, turn: int, by: str, profile: str = "", source: str = "api") -> Run:
    """A new run of a new task that reuses ``run``'s model turns 1..``turn`` and asks
    ``profile`` (default: the original's) from there; queued and woken on commit."""
    if run.status not in TERMINAL:
        raise CommandRefused("run_active", f"run {run.id} is {run.status}; fork a finished run")
    if hasattr(run, "imported"):
        raise CommandRefused("run_imported", "an imported run is read-only")
    if run.feedback:
        # A follow-up started from its pull request's branch and its review feedback; a
        # fork's new task has neither, so the reused turns would answer another request.
        raise CommandRefused("run_followup", "a follow-up run cannot be forked; fork run 1")
    turns = list(
        ModelTurn.objects.filter(run=run)
        .select_related("request_artifact", "response_artifact")
        .order_by("step_no", "turn_no")
    )
    if not 0 <= turn <= len(turns):
        raise CommandRefused("turn_out_of_range", f"run {run.id} has {len(turns)} model turns")
    original: Task = run.task
    options: dict[str, Any] = dict(original.model_options or {})
    if profile:
        try:
            profile_get(profile)
        except ProfileError as exc:
            raise CommandRefused("model_profile_unknown", str(exc)) from exc
        options["profile"] = profile
    fork_of = {"run_id": str(run.id), "task_id": str(original.id), "turn": turn}
    with transaction.atomic():
        submission = task_submit(
            workspace=original.workspace,
            repository=original.repository,
            instruction=original.instruction,
            source=source,
            requested_by=by,
            execution_mode=Task.Mode.DRY_RUN,
            risk_level=original.risk_level,
            task_type=original.task_type,
            target_branch=original.target_branch,
            budget=dict(original.budget or {}),
            model_options=options,
            source_ref={"fork_of": fork_of},
        )
        if submission.run is None:
            # A deferred task would start later without the seeded turns.
            raise CommandRefused("deferred", "the workspace is at capacity; fork again later")
        fork = submission.run
        _turns_seed(turns[:turn], fork)
        data = {
            "source_run_id": str(run.id),
            "fork_run_id": str(fork.id),
            "fork_task_id": str(submission.task.id),
            "turn": turn,
            "model_profile": profile or "",
        }
        event_record(task=original, run=run, type="agent.run.forked", data=data, actor=by)
        event_record(task=submission.task, run=fork, type="agent.run.forked", data=data, actor=by)
    return fork
