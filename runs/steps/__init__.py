"""One handler per run state. A handler does the state's work and returns an Outcome;
the engine commits it. Handlers are safe to re-execute after a crash: rows they create
carry natural keys, and the working copy is rebuilt from the last checkpoint."""

from __future__ import annotations

from runs.protocol import Handler
from runs.steps.approval import step_awaiting_approval
from runs.steps.asking import step_awaiting_input
from runs.steps.common import S, _restore, _retry_with_feedback, _sandbox
from runs.steps.context import (
    CONTEXT_CHAR_BUDGET,
    SYSTEM_PROMPT,
    repository_map,
    step_context_loading,
)
from runs.steps.creating_pr import step_creating_pr
from runs.steps.judging import JUDGE_PROMPT, _model_judge, step_judging
from runs.steps.planning import step_planning
from runs.steps.preparing import step_preparing, step_queued
from runs.steps.running import (
    MUTATING_TOOLS,
    TURNS_PER_STEP,
    _call_ids,
    _patch_record,
    _short,
    _tool_call_run,
    _toolbox,
    step_running,
)
from runs.steps.verifying import step_verifying

__all__ = [
    "CONTEXT_CHAR_BUDGET",
    "HANDLERS",
    "JUDGE_PROMPT",
    "MUTATING_TOOLS",
    "SYSTEM_PROMPT",
    "TURNS_PER_STEP",
    "S",
    "_call_ids",
    "_model_judge",
    "_patch_record",
    "_restore",
    "_retry_with_feedback",
    "_sandbox",
    "_short",
    "_tool_call_run",
    "_toolbox",
    "repository_map",
    "step_awaiting_approval",
    "step_awaiting_input",
    "step_context_loading",
    "step_creating_pr",
    "step_judging",
    "step_planning",
    "step_preparing",
    "step_queued",
    "step_running",
    "step_verifying",
]

HANDLERS: dict[str, Handler] = {
    S.QUEUED: step_queued,
    S.PREPARING: step_preparing,
    S.CONTEXT_LOADING: step_context_loading,
    S.PLANNING: step_planning,
    S.RUNNING: step_running,
    S.VERIFYING: step_verifying,
    S.JUDGING: step_judging,
    S.AWAITING_APPROVAL: step_awaiting_approval,
    S.AWAITING_INPUT: step_awaiting_input,
    S.CREATING_PR: step_creating_pr,
}
