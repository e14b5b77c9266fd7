"""Run replay: a finished run reproduced in a fresh sandbox, without asking any model.

The reproduction starts from the run's base commit in a new platform repository (a
fresh clone of the origin as it is today) and a new working copy, and carries out, in
the recorded order, every tool call the recorded model answers asked for: the answers
come from the ModelTurn checkpoints, so no model is called. Each result is compared
with the recorded one (numbers and working-copy paths masked, as the transcript
comparison does); then the reproduced diff with the recorded patch, the repository's
tests on it with the recorded verification, and finally the recorded patch against
the default branch as it is now (does it still apply, do the tests still pass).
Every difference is a divergence in the replay's report; none means ``reproduced``.

A replay is a RunReplay row and a ``run.replay`` work item made in one transaction
(docs/design.md §1.1): a lost wake-up is found by the work sweep, and a replay that a
dead worker left ``running`` starts over in a fresh sandbox.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from jobs.work import work_enqueue
from runs.agent import platform_git
from runs.agent.artifacts import redact
from runs.agent.sandbox import LocalSandbox, SandboxError, platform_repository_root
from runs.agent.setup import setup_ensure
from runs.agent.tools import Toolbox, ToolDenied, ToolPolicy
from runs.agent.transcript import NUMBER
from runs.agent.verify import verification_classify
from runs.gitproviders import git_provider_for
from runs.models import ModelTurn, Patch, Run, RunReplay, ToolCall, VerificationAttempt
from runs.repositories import CloneUrlRefused, clone_url_check_before_use
from runs.services import CommandRefused
from runs.state import TERMINAL
from runs.timeline import event_record

REPLAY_WORK = "run.replay"
# Working copies of runs and replays, as paths in tool output name them.
WORKDIR = re.compile(r"(?:run|replay)-[0-9a-f-]{36}-\d+")

Progress = Callable[[int, int, str], None]


@dataclass
class _Replaying:
    replay: RunReplay
    run: Run
    progress: Progress | None
    divergences: list[dict[str, Any]] = field(default_factory=list)
    done: int = 0

    def step(self, what: str) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.replay.total, what)
        RunReplay.objects.filter(pk=self.replay.pk).update(progress=self.done)

    def diverged(self, kind: str, **details: Any) -> None:
        self.divergences.append({"kind": kind, **details})


def replay_request(*, run: Run, by: str) -> RunReplay:
    """A queued replay of the finished ``run``, woken on commit."""
    if run.status not in TERMINAL:
        raise CommandRefused("run_active", f"run {run.id} is {run.status}; replay a finished run")
    if hasattr(run, "imported"):
        raise CommandRefused("run_imported", "an imported run has no repository to replay in")
    with transaction.atomic():
        replay = RunReplay.objects.create(run=run, requested_by=by, total=_steps_total(run))
        work_enqueue(kind=REPLAY_WORK, key=str(replay.id), args={"replay_id": str(replay.id)})
    return replay


def _steps_total(run: Run) -> int:
    return ToolCall.objects.filter(run=run).count() + 3


def _recorded_calls(run: Run) -> list[ToolCall]:
    """The run's tool calls in the order they ran: by turn, then as the answer listed them."""
    order = {
        (t.step_no, t.turn_no): position
        for position, t in enumerate(
            ModelTurn.objects.filter(run=run).order_by("step_no", "turn_no")
        )
    }
    calls = list(ToolCall.objects.filter(run=run).order_by("step_no", "turn_no", "id"))
    return sorted(calls, key=lambda c: (order.get((c.step_no, c.turn_no), 0), c.id))


def replay_execute(*, replay_id: str, progress: Progress | None = None) -> RunReplay:
    """Carry the replay out (again, from scratch, if a worker died in it) and report."""
    replay = RunReplay.objects.select_related("run__task__repository").get(pk=replay_id)
    if replay.status not in (RunReplay.Status.QUEUED, RunReplay.Status.RUNNING):
        return replay
    RunReplay.objects.filter(pk=replay.pk).update(status=RunReplay.Status.RUNNING, progress=0)
    state = _Replaying(replay=replay, run=replay.run, progress=progress)
    # Not named "run-…": the sandbox orphan sweep would take it for an ended run's.
    git_dir = platform_repository_root() / f"replay-{replay.id}.git"
    sandboxes: list[LocalSandbox] = []
    report: dict[str, Any] = {"base_commit": state.run.base_commit, "model_requests": 0}
    try:
        _fresh_clone(state.run, git_dir)
        sandbox = _working_copy(replay, git_dir, 1, state.run.base_commit, sandboxes)
        report["tool_calls"] = _calls_replay(state, sandbox)
        report.update(_patch_compare(state, sandbox))
        report["tests"] = _tests_compare(state, sandbox)
        report["head"] = _head_check(state, git_dir, sandboxes)
        status = RunReplay.Status.DIVERGED if state.divergences else RunReplay.Status.REPRODUCED
    except (SandboxError, CloneUrlRefused) as exc:
        state.diverged("replay_errored", error=redact(str(exc))[:1000])
        status = RunReplay.Status.ERRORED
    except Exception as exc:
        # Ended, not retried: a replay is re-requested by whoever reads its report, and
        # one that stays "running" behind a dead letter tells them nothing.
        error = f"{type(exc).__name__}: {exc}"
        state.diverged("replay_errored", error=redact(error)[:1000])
        status = RunReplay.Status.ERRORED
    finally:
        for sandbox in sandboxes:
            sandbox.remove()
        shutil.rmtree(git_dir, ignore_errors=True)
    return _replay_finish(state, status, report)


def _replay_finish(state: _Replaying, status: str, report: dict[str, Any]) -> RunReplay:
    replay, run = state.replay, state.run
    with transaction.atomic():
        updated = RunReplay.objects.filter(pk=replay.pk, status=RunReplay.Status.RUNNING).update(
            status=status,
            divergences=state.divergences,
            report=report,
            finished_at=timezone.now(),
        )
        if updated:
            event_record(
                task=run.task,
                run=run,
                type="agent.run.replayed",
                data={
                    "replay_id": str(replay.id),
                    "outcome": status,
                    "divergences": len(state.divergences),
                    "first_divergence": state.divergences[0]["kind"] if state.divergences else "",
                },
                actor=replay.requested_by,
            )
    replay.refresh_from_db()
    return replay


def _fresh_clone(run: Run, git_dir: Path) -> None:
    repository = run.task.repository
    clone_url_check_before_use(repository.clone_url)
    config, secret = git_provider_for(repository.provider).git_credentials(repository)
    shutil.rmtree(git_dir, ignore_errors=True)
    platform_git.repository_fetch(
        url=repository.clone_url, dest=git_dir, config=config, secret=secret
    )


def _working_copy(
    replay: RunReplay, git_dir: Path, n: int, commit: str, made: list[LocalSandbox], diff: str = ""
) -> LocalSandbox:
    sandbox = LocalSandbox(f"replay-{replay.id}-{n}")
    sandbox.git_dir = git_dir
    sandbox.create()
    made.append(sandbox)
    platform_git.worktree_create(git_dir=git_dir, workdir=sandbox.path, commit=commit, diff=diff)
    setup_ensure(repository=replay.run.task.repository, sandbox=sandbox, base_commit=commit)
    return sandbox


def _masked(text: str) -> str:
    return NUMBER.sub("N", WORKDIR.sub("<workdir>", text))


def _calls_replay(state: _Replaying, sandbox: LocalSandbox) -> int:
    """Every recorded tool call again, in order; a result that differs is a divergence."""
    repository = state.run.task.repository
    toolbox = Toolbox(
        sandbox,
        ToolPolicy(
            forbidden_paths=list(repository.forbidden_paths),
            allowed_commands=list(repository.allowed_commands),
            command_timeout=settings.COMMAND_TIMEOUT_SECONDS,
        ),
        test_command=repository.test_command,
        history={},
        focus=state.run.task.instruction,
    )
    replayed = 0
    for call in _recorded_calls(state.run):
        where = {"step_no": call.step_no, "turn_no": call.turn_no, "call_id": call.call_id}
        state.step(f"{call.tool} ({call.step_no}.{call.turn_no})")
        if call.status == ToolCall.Status.REJECTED:
            continue  # the model's malformed call was never run
        replayed += 1
        try:
            toolbox.check(call.tool, call.arguments)
        except ToolDenied as exc:
            if call.status != ToolCall.Status.DENIED:
                state.diverged("tool_denied_now", tool=call.tool, **where, reason=str(exc))
            continue
        if call.status == ToolCall.Status.DENIED:
            state.diverged("tool_allowed_now", tool=call.tool, **where)
            continue
        result = toolbox.execute(call.tool, call.arguments)
        recorded = str((call.result or {}).get("output", ""))
        now = redact(result.output[:4000])
        if result.status != call.status or _masked(now) != _masked(recorded):
            state.diverged(
                "tool_result",
                tool=call.tool,
                **where,
                recorded_status=call.status,
                status=result.status,
                recorded=recorded[:500],
                now=now[:500],
            )
    return replayed


def _last_patch(run: Run) -> Patch | None:
    return (
        Patch.objects.filter(run=run)
        .select_related("diff_artifact")
        .order_by("-attempt_no")
        .first()
    )


def _patch_compare(state: _Replaying, sandbox: LocalSandbox) -> dict[str, Any]:
    state.step("patch")
    diff = platform_git.tree_build(
        git_dir=sandbox.git_dir or Path(), workdir=sandbox.path, base=state.run.base_commit
    )[1]
    recorded = _last_patch(state.run)
    report = {"patch_sha256": diff.sha256 if diff.text.strip() else ""}
    report["recorded_patch_sha256"] = recorded.diff_sha256 if recorded else ""
    if report["patch_sha256"] != report["recorded_patch_sha256"]:
        state.diverged(
            "patch_differs",
            recorded=report["recorded_patch_sha256"],
            now=report["patch_sha256"],
            files=diff.files,
        )
    return report


def _tests_run(sandbox: LocalSandbox, command: str) -> dict[str, Any]:
    result = sandbox.run(command, timeout=settings.COMMAND_TIMEOUT_SECONDS)
    return {"outcome": verification_classify(result), "exit_code": result.exit_code}


def _tests_compare(state: _Replaying, sandbox: LocalSandbox) -> dict[str, Any]:
    """The test command on the reproduced tree, against the last recorded verification."""
    state.step("tests")
    recorded = (
        VerificationAttempt.objects.filter(run=state.run).order_by("-patch__attempt_no").first()
    )
    if recorded is None:
        return {"recorded": None}
    now = _tests_run(sandbox, recorded.command)
    if now["outcome"] != recorded.outcome:
        state.diverged(
            "tests_differ", command=recorded.command, recorded=recorded.outcome, now=now["outcome"]
        )
    return {"recorded": recorded.outcome, **now}


def _head_check(state: _Replaying, git_dir: Path, made: list[LocalSandbox]) -> dict[str, Any]:
    """The recorded patch on the default branch as it is today: applies, tests pass."""
    state.step("default branch today")
    repository = state.run.task.repository
    patch = _last_patch(state.run)
    try:
        head = platform_git.commit_resolve(git_dir, f"origin/{repository.default_branch}")
    except platform_git.PlatformGitError as exc:
        state.diverged("branch_gone", branch=repository.default_branch, error=str(exc)[:300])
        return {"commit": ""}
    report: dict[str, Any] = {"commit": head, "moved": head != state.run.base_commit}
    if patch is None or not report["moved"]:
        return report
    try:
        sandbox = _working_copy(
            state.replay, git_dir, 2, head, made, diff=patch.diff_artifact.content
        )
    except platform_git.PlatformGitError as exc:
        report["applies"] = False
        state.diverged(
            "patch_no_longer_applies",
            branch=repository.default_branch,
            commit=head,
            error=redact(str(exc))[:500],
        )
        return report
    report["applies"] = True
    recorded = VerificationAttempt.objects.filter(patch=patch).first()
    tests = _tests_run(sandbox, recorded.command if recorded else repository.test_command)
    report["tests"] = tests
    if recorded is not None and tests["outcome"] != recorded.outcome:
        state.diverged(
            "tests_fail_on_branch",
            branch=repository.default_branch,
            commit=head,
            recorded=recorded.outcome,
            now=tests["outcome"],
        )
    return report


def replay_work(*, replay_id: str) -> None:
    """The ``run.replay`` work item's handler."""
    replay_execute(replay_id=replay_id)
