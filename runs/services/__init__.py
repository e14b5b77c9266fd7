"""Use cases that change runs and tasks. Each is one transaction; wake-ups go on commit.

These are commands: they can be refused (``CommandRefused``). They never set a run's
status themselves; they record a request (cancellation, an approval decision) and wake
the orchestrator, which decides. A task's status is written here and by the run's end
(``runs.ending``) only.

The package's modules: ``errors``, ``admission``, ``submission``, ``commands``,
``followups``, ``pull_requests``; the names most callers use are exported here.
"""

from runs.services.admission import admission_check, request_fingerprint, tasks_readmit
from runs.services.commands import (
    approval_permission_check,
    approvals_expire,
    approvals_void,
    run_approve,
    run_cancel_request,
    run_reject,
)
from runs.services.errors import (
    ApprovalNotAllowed,
    CommandRefused,
    IdempotencyConflict,
    IdempotencyKeyReserved,
)
from runs.services.followups import (
    after_terminal_needed_sql,
    run_after_terminal,
    run_recover_stalled,
    task_followup,
    task_retry,
)
from runs.services.submission import Submission, task_submit

__all__ = [
    "ApprovalNotAllowed",
    "CommandRefused",
    "IdempotencyConflict",
    "IdempotencyKeyReserved",
    "Submission",
    "admission_check",
    "after_terminal_needed_sql",
    "approval_permission_check",
    "approvals_expire",
    "approvals_void",
    "request_fingerprint",
    "run_after_terminal",
    "run_approve",
    "run_cancel_request",
    "run_recover_stalled",
    "run_reject",
    "task_followup",
    "task_retry",
    "task_submit",
    "tasks_readmit",
]
