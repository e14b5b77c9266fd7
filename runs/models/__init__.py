"""Tenants, repositories, tasks, runs and everything a run leaves behind.

One module per part (``tenants``, ``task``, ``records``, ``accounting``, ``inputs``;
the recorded history's rows live in ``runs.replay.records``); every model is imported
here, so Django registers each with the app and ``runs.models.<Name>`` names it.
"""

from runs.models.accounting import ActiveRunCount, WorkspaceSpend
from runs.models.inputs import InputRequest
from runs.models.records import (
    Approval,
    Artifact,
    JudgeAttempt,
    ModelTurn,
    Patch,
    PullRequest,
    ToolCall,
    VerificationAttempt,
)
from runs.models.task import RUN_TERMINAL_STATUSES, Run, RunEvent, Task
from runs.models.tenants import (
    DEFAULT_ALLOWED_COMMANDS,
    DEFAULT_FORBIDDEN_PATHS,
    ApiToken,
    Membership,
    ProviderIdentity,
    Repository,
    Workspace,
    default_allowed_commands,
    default_forbidden_paths,
    default_setup_cache_paths,
    default_setup_lock_files,
)
from runs.replay.records import RunFoldSnapshot, RunImport, RunReplay

__all__ = [
    "DEFAULT_ALLOWED_COMMANDS",
    "DEFAULT_FORBIDDEN_PATHS",
    "RUN_TERMINAL_STATUSES",
    "ActiveRunCount",
    "ApiToken",
    "Approval",
    "Artifact",
    "InputRequest",
    "JudgeAttempt",
    "Membership",
    "ModelTurn",
    "Patch",
    "ProviderIdentity",
    "PullRequest",
    "Repository",
    "Run",
    "RunEvent",
    "RunFoldSnapshot",
    "RunImport",
    "RunReplay",
    "Task",
    "ToolCall",
    "VerificationAttempt",
    "Workspace",
    "WorkspaceSpend",
    "default_allowed_commands",
    "default_forbidden_paths",
    "default_setup_cache_paths",
    "default_setup_lock_files",
]
