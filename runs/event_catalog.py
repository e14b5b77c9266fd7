"""The catalogue of the platform's events (docs/design.md §5): one data schema per type.

Registered with ``jobs.contracts`` by ``RunsConfig.ready``; ``manage.py event_catalog``
writes ``docs/events/<type>/v1.json`` and ``docs/asyncapi.yaml`` from it, and
``--check`` fails when they differ. Schemas require what producers always send and allow
anything more: adding a field is compatible, removing or renaming one needs a new version.
"""

from __future__ import annotations

from jobs.contracts import (
    ANY_LIST,
    BOOL,
    DECIMAL,
    ID,
    INT,
    NULLABLE_STR,
    NUM,
    STR,
    STR_LIST,
    SYSTEM,
    TASK,
    EventType,
)
from jobs.contracts import event_type as _e

# The prefix of every type here; the AsyncAPI document names messages without it.
NAMESPACE = "agent."

_TERMINAL = {"run_no": INT}
_FAILURE = {"reason": STR, "detail": STR}
_TOOL = {"tool_call_id": ID, "tool": STR, "turn_no": INT}
_VERIFY = {"patch_id": ID, "command": STR, "attempt_no": INT}
_VERIFY_RESULT = {
    **_VERIFY,
    "outcome": STR,
    "exit_code": {"type": ["integer", "null"]},
    "duration_ms": {"type": ["integer", "null"]},
    "log_artifact_id": NULLABLE_STR,
    # {"ran", "passed", "failed"} as the runner reported them, for the patch and for the
    # base commit's run of the same command (null: the output said no count).
    "tests": {"type": ["object", "null"]},
    "baseline": {"type": ["object", "null"]},
}
_PR = {"number": {"type": ["integer", "null"]}, "url": STR}

CATALOG: list[EventType] = [
    _e(
        "agent.task.submitted",
        "A task was recorded.",
        TASK,
        required={"repository": STR, "source": STR, "execution_mode": STR},
        optional={"requested_by": STR},
    ),
    _e(
        "agent.task.accepted",
        "Admission accepted the task; its run exists.",
        TASK,
        required={"run_no": INT},
    ),
    _e("agent.task.rejected", "The task was refused.", TASK, optional={"reason": STR}),
    _e(
        "agent.task.deferred",
        "Over a limit: the task waits for capacity.",
        TASK,
        required={"reason": STR},
    ),
    _e("agent.task.queued", "The task's run is queued.", TASK, required={"run_no": INT}),
    _e(
        "agent.task.cancelled",
        "The task ended cancelled.",
        TASK,
        required=_TERMINAL,
        optional=_FAILURE,
    ),
    _e("agent.task.completed", "The task ended successfully.", TASK, required=_TERMINAL),
    _e("agent.task.failed", "The task ended failed.", TASK, required=_TERMINAL, optional=_FAILURE),
    _e(
        "agent.run.queued",
        "A run was created and waits for a worker.",
        required={"run_no": INT},
        optional={"followup": BOOL},
    ),
    _e(
        "agent.run.started",
        "A worker started the run.",
        required={"run_no": INT},
        optional={"attempt": INT},
    ),
    _e(
        "agent.run.status.changed",
        "The run moved in the state machine.",
        required={"from": STR, "to": STR},
        optional={"reason": STR},
    ),
    _e(
        "agent.run.heartbeat.missed",
        "The run's lease expired: its worker is gone or stalled.",
        required={"attempt": INT, "recoveries": INT},
        optional={"lease_owner": STR, "lease_until": NULLABLE_STR},
    ),
    _e(
        "agent.run.recovered",
        "The reaper handed the run to a new worker.",
        required={"step_no": INT, "recoveries": INT},
        optional={"model_turns": INT, "crashes_here": INT},
    ),
    _e(
        "agent.run.cancel.requested",
        "Someone asked to cancel the run.",
        required={"by": STR},
        optional={"reason": STR},
    ),
    _e("agent.run.cancelled", "The run ended cancelled.", required=_TERMINAL, optional=_FAILURE),
    _e("agent.run.failed", "The run ended failed.", required=_TERMINAL, optional=_FAILURE),
    _e("agent.run.completed", "The run ended successfully.", required=_TERMINAL),
    _e("agent.run.timed_out", "The run ran out of time.", required=_TERMINAL, optional=_FAILURE),
    _e(
        "agent.run.operator_action",
        "An operator acted on the run from the console.",
        required={"action": STR, "by": STR},
        optional={"outcome": STR, "note": STR},
    ),
    _e(
        "agent.run.replayed",
        "The finished run was reproduced from its record; outcome and divergences found.",
        required={"replay_id": STR, "outcome": STR, "divergences": INT},
        optional={"first_divergence": STR},
    ),
    _e(
        "agent.run.forked",
        "A new run reuses this run's first model turns (on both runs' timelines).",
        required={"source_run_id": STR, "fork_run_id": STR, "fork_task_id": STR, "turn": INT},
        optional={"model_profile": STR},
    ),
    _e(
        "agent.sandbox.created",
        "The repository was cloned into the run's sandbox.",
        required={"base_commit": STR},
        optional={"ref": STR, "sandbox": STR},
    ),
    _e(
        "agent.setup.completed",
        "The repository's setup ran in the sandbox, or its cached result was mounted read-only.",
        required={"cache_key": STR, "cached": BOOL, "duration_ms": INT},
        optional={"network": BOOL},
    ),
    _e(
        "agent.environment.detected",
        "The repository names no test command: the one its files call for, and the setup "
        "installing its test dependencies, were detected for this run.",
        required={"kind": STR, "test_command": STR},
        optional={"setup_command": STR, "evidence": STR_LIST},
    ),
    _e(
        "agent.environment.failed",
        "The environment kept the tests from running (setup failed, a command or the test "
        "runner missing): the run ends with the environment's reason, no attempt spent.",
        required={"reason": STR, "stage": STR},
        optional={"command": STR, "output_tail": STR},
    ),
    _e(
        "agent.context.loaded",
        "The repository map was built for the model.",
        required={"artifact_id": STR},
        optional={"chars": INT},
    ),
    _e(
        "agent.plan.created",
        "The model wrote its plan.",
        required={"artifact_id": STR},
        optional={"summary": STR},
    ),
    _e(
        "agent.model.turn.completed",
        "A model call answered (response checkpointed).",
        required={"turn_no": INT, "tokens_in": INT, "tokens_out": INT, "cost_usd": DECIMAL},
        optional={
            "step_no": INT,
            "purpose": STR,
            "model": STR,
            "tool_calls": STR_LIST,
            "request_artifact_id": STR,
            "response_artifact_id": STR,
            "finish_reason": STR,
            "usage_estimated": BOOL,
            "problem": STR,
            "reasoning_chars": INT,
        },
    ),
    _e(
        "agent.model.error",
        "The model's reply was unusable as sent (bad tool call, text only, cut off); "
        "it was answered with what to fix and counts against the model_errors budget.",
        required={"turn_no": INT, "problem": STR},
        optional={"step_no": INT, "finish_reason": STR, "tool_calls": STR_LIST},
    ),
    _e(
        "agent.model.request.retried",
        "A model request failed transiently (rate limit, server error, no reply, lost "
        "connection) and is sent again after the back-off given.",
        required={"turn_no": INT, "attempt": INT, "wait_seconds": NUM, "error": STR},
        optional={"step_no": INT, "status": INT, "retry_after": BOOL, "purpose": STR},
    ),
    _e(
        "agent.model.request.throttled",
        "A model request waits for the profile's shared rate limit (limit: requests or "
        "tokens per minute) before it is sent.",
        required={"turn_no": INT, "limit": STR, "wait_seconds": NUM},
        optional={"step_no": INT, "purpose": STR},
    ),
    _e(
        "agent.model.request.failed",
        "A model request failed: refused (error is the provider's explanation) or still "
        "failing after its retries (retryable: the step is retried later).",
        required={"turn_no": INT, "error": STR, "retryable": BOOL},
        optional={"step_no": INT, "status": INT, "attempts": INT, "purpose": STR},
    ),
    _e(
        "agent.model.stream.progress",
        "A streamed model reply is arriving (reported at most every "
        "MODEL_STREAM_PROGRESS_SECONDS).",
        required={"turn_no": INT, "chunks": INT, "chars": INT},
        optional={"step_no": INT, "elapsed_ms": INT, "purpose": STR},
    ),
    _e(
        "agent.context.condensed",
        "Older tool outputs or turns were condensed to keep the conversation in the window.",
        required={"turn_no": INT},
        optional={
            "messages_before": INT,
            "messages_after": INT,
            "reason": STR,
            "tokens_before": INT,
            "tokens_after": INT,
            "limit": INT,
            "summary": BOOL,
        },
    ),
    _e(
        "agent.tool.call.requested",
        "The model asked for a tool call.",
        required=_TOOL,
        optional={"arguments": {}},
    ),
    _e(
        "agent.tool.call.denied",
        "Policy refused the tool call.",
        required=_TOOL,
        optional={"reason": STR},
    ),
    _e("agent.tool.call.started", "The tool call started.", required=_TOOL),
    _e(
        "agent.tool.call.completed",
        "The tool call finished.",
        required=_TOOL,
        optional={"duration_ms": {"type": ["integer", "null"]}, "error": STR},
    ),
    _e(
        "agent.tool.call.failed",
        "The tool call failed.",
        required=_TOOL,
        optional={"duration_ms": {"type": ["integer", "null"]}, "error": STR},
    ),
    _e(
        "agent.tool.call.timed_out",
        "The tool call hit its timeout.",
        required=_TOOL,
        optional={"duration_ms": {"type": ["integer", "null"]}, "error": STR},
    ),
    _e("agent.policy.denied", "A policy refused an action.", optional={**_TOOL, "reason": STR}),
    _e(
        "agent.budget.exhausted",
        "A budget of the task is spent.",
        required={"budget": STR},
        optional={"used": NUM, "limit": NUM, "reason": STR},
    ),
    _e(
        "agent.patch.created",
        "The agent's change was captured as a patch.",
        required={"patch_id": ID, "sha256": STR},
        optional={
            "attempt_no": INT,
            "files": STR_LIST,
            "lines_added": INT,
            "lines_removed": INT,
            "artifact_id": NULLABLE_STR,
            "submitted_by": {"enum": ["model", "budget", "loop"]},
        },
    ),
    _e(
        "agent.run.autosubmitted",
        "Turns, cost or wall clock ran out, or a loop was stopped, with changes in the "
        "working copy: the diff goes to verification like a finished attempt.",
        required={"submitted_by": {"enum": ["budget", "loop"]}, "reason": STR},
        optional={"sha256": STR, "files": STR_LIST},
    ),
    _e(
        "agent.loop.detected",
        "The model made the same calls and got the same results several turns in a row: "
        "it was nudged, or the loop was stopped.",
        required={"turn_no": INT, "action": {"enum": ["nudge", "stop"]}},
        optional={"step_no": INT, "stale_turns": INT, "calls": STR_LIST},
    ),
    _e(
        "agent.verification.started",
        "The repository's tests started on the patch.",
        required=_VERIFY,
    ),
    _e("agent.verification.passed", "The tests passed.", required=_VERIFY, optional=_VERIFY_RESULT),
    _e("agent.verification.failed", "The tests failed.", required=_VERIFY, optional=_VERIFY_RESULT),
    _e(
        "agent.verification.errored",
        "The tests could not run.",
        required=_VERIFY,
        optional=_VERIFY_RESULT,
    ),
    _e(
        "agent.judge.completed",
        "The judge gave its verdict on the patch.",
        required={"verdict": STR},
        optional={"patch_id": ID, "judge": STR, "findings": ANY_LIST},
    ),
    _e(
        "agent.approval.requested",
        "The patch waits for a human decision.",
        required={"patch_sha256": STR},
        optional={"patch_id": ID, "expires_at": STR},
    ),
    _e(
        "agent.approval.approved",
        "A human approved the patch.",
        required={"by": STR},
        optional={"comment": STR, "patch_sha256": STR},
    ),
    _e(
        "agent.approval.rejected",
        "A human rejected the patch.",
        required={"by": STR},
        optional={"comment": STR, "patch_sha256": STR},
    ),
    _e("agent.approval.expired", "Nobody decided in time.", optional={"expired_at": STR}),
    _e(
        "agent.run.input.requested",
        "The run waits for a person: a question the agent asked, or its plan for review.",
        required={"question_id": STR, "kind": STR, "question": STR},
        optional={"choices": STR_LIST, "expires_at": STR},
    ),
    _e(
        "agent.run.input.received",
        "A person answered the run's question (or accepted, edited or rejected its plan).",
        required={"question_id": STR, "by": STR, "answer": STR},
        optional={"kind": STR, "via": STR, "decision": STR},
    ),
    _e(
        "agent.run.input.expired",
        "Nobody answered the run's question in time; the run ends timed_out.",
        required={"question_id": STR},
        optional={"expired_at": STR},
    ),
    _e(
        "agent.pr.creation.requested",
        "The run started opening its pull request.",
        required={"branch": STR},
        optional={"base": STR},
    ),
    _e(
        "agent.pr.created",
        "The pull request was opened.",
        required=_PR,
        optional={"branch": STR, "head_sha": STR},
    ),
    _e(
        "agent.pr.updated",
        "The pull request got new commits or was reopened.",
        required=_PR,
        optional={"branch": STR, "head_sha": STR, "state": STR, "by": STR},
    ),
    _e(
        "agent.pr.creation.failed",
        "The pull request could not be opened.",
        optional={"reason": STR, "detail": STR},
    ),
    _e(
        "agent.pr.skipped",
        "No pull request (dry run).",
        required={"reason": STR},
        optional={"patch_id": ID},
    ),
    _e(
        "agent.pr.merged",
        "The pull request was merged.",
        required=_PR,
        optional={"state": STR, "by": STR},
    ),
    _e(
        "agent.pr.closed",
        "The pull request was closed without merge.",
        required=_PR,
        optional={"state": STR, "by": STR},
    ),
    _e(
        "agent.job.dead_lettered",
        "A background job exhausted its retries.",
        SYSTEM,
        required={"dead_letter_id": STR, "task_name": STR, "exception": STR, "attempts": INT},
        optional={"recoveries": INT},
    ),
    _e("agent.webhook.received", "A Git provider webhook was accepted.", SYSTEM),
]
