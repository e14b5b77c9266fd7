"""Answers to the questions a run waits on (``awaiting_input``, docs/design.md §4, §7).

One service call records an answer for every path (API, console, a provider comment),
under one policy: the answerer is a member the workspace's ``approval_by`` lets decide
(or a superuser), the run is waiting for exactly that question, and a question is
answered once. The answer is a fact on the timeline (``agent.run.input.received``) and
a wake-up for the run; the run's own step takes it from there (runs.steps.asking). The
beat safety net expires questions nobody answered in ``INPUT_TTL_SECONDS``.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from jobs.work import PermanentWorkError, work_enqueue
from runs import dispatch
from runs.gitproviders import git_provider_for
from runs.gitproviders.base import GitProviderError
from runs.logs import log
from runs.models import InputRequest, Membership, PullRequest, Repository, Run, Task, Workspace
from runs.services import ApprovalNotAllowed, CommandRefused
from runs.state import TERMINAL
from runs.timeline import event_record

INPUT_NOTIFY = "run.input.notify"
MAX_ANSWER_CHARS = 20000
NOTIFY_MARKER = "<!-- agentplatform:input:{id} -->"


def input_permission_check(*, run: Run, user: Any) -> None:
    """Raise ApprovalNotAllowed unless ``user`` may answer for the run's workspace: the
    members ``approval_by`` names (approvers and admins, or everyone), or a superuser."""
    if user is None:
        raise ApprovalNotAllowed("answer_not_allowed", "an answer needs a platform user")
    if user.is_superuser:
        return
    workspace = run.task.workspace
    role = (
        Membership.objects.filter(workspace=workspace, user=user)
        .values_list("role", flat=True)
        .first()
    )
    if role is None:
        raise ApprovalNotAllowed("answer_not_allowed", "not a member of the workspace")
    if workspace.approval_by == Workspace.ApprovalBy.APPROVERS and role not in (
        Membership.Role.APPROVER,
        Membership.Role.ADMIN,
    ):
        raise ApprovalNotAllowed(
            "answer_not_allowed",
            f"the workspace lets {workspace.get_approval_by_display()} answer; your role is {role}",
        )


def _answer_checked(request: InputRequest, answer: str, decision: str) -> tuple[str, str]:
    """The (answer, decision) to record, or CommandRefused (invalid_answer)."""
    answer = (answer or "").strip()
    if len(answer) > MAX_ANSWER_CHARS:
        raise CommandRefused("invalid_answer", f"keep the answer under {MAX_ANSWER_CHARS} chars")
    if request.kind == InputRequest.Kind.PLAN:
        decision = (decision or ("edit" if answer else "accept")).lower()
        if decision not in InputRequest.Decision.values:
            raise CommandRefused("invalid_answer", "a plan is answered accept, edit or reject")
        if decision == InputRequest.Decision.EDIT and not answer:
            raise CommandRefused("invalid_answer", "an edited plan needs the plan as the answer")
        return answer, decision
    if not answer:
        raise CommandRefused("invalid_answer", "the answer is empty")
    return answer, ""


def input_answer(
    *,
    run: Run,
    question_id: Any,
    answer: str,
    by: str,
    user: Any,
    via: str,
    decision: str = "",
) -> InputRequest:
    """Record the answer to the run's pending question and wake the run.

    Refused (CommandRefused, 409 at the API) when the run ended (``run_ended``), when the
    question was already answered or expired (``input_already_answered``,
    ``input_expired``), or when the run is not waiting for it (``not_awaiting_input``).
    """
    with transaction.atomic():
        locked = Run.objects.select_for_update().select_related("task__workspace").get(pk=run.pk)
        request = (
            InputRequest.objects.select_for_update().filter(run=locked, pk=question_id).first()
        )
        if request is None:
            raise CommandRefused("unknown_question", "the run asked no such question")
        if request.status == InputRequest.Status.ANSWERED:
            raise CommandRefused(
                "input_already_answered",
                f"the question was answered by {request.answered_by} at "
                f"{request.answered_at:%Y-%m-%d %H:%M:%S} UTC",
            )
        if locked.status in TERMINAL:
            raise CommandRefused(
                "run_ended", f"the run ended {locked.status}; it takes no more answers"
            )
        if request.status == InputRequest.Status.EXPIRED:
            raise CommandRefused("input_expired", "the question expired unanswered")
        if locked.status != Run.Status.AWAITING_INPUT or request.status != "pending":
            raise CommandRefused(
                "not_awaiting_input", f"run is {locked.status}, not waiting for this answer"
            )
        input_permission_check(run=locked, user=user)
        answer, decision = _answer_checked(request, answer, decision)
        request.status = InputRequest.Status.ANSWERED
        request.answered_at = timezone.now()
        request.answered_by = by[:200]
        request.answered_via = via
        request.answer = answer
        request.decision = decision
        request.save(
            update_fields=[
                "status",
                "answered_at",
                "answered_by",
                "answered_via",
                "answer",
                "decision",
            ]
        )
        dispatch.run_wake_on_commit(run_id=locked.id, step_no=locked.step_no, status=locked.status)
        event_record(
            task=locked.task,
            run=locked,
            type="agent.run.input.received",
            data={
                "question_id": str(request.id),
                "kind": request.kind,
                "by": request.answered_by,
                "via": via,
                "decision": decision,
                "answer": answer[:2000],
            },
            actor=request.answered_by,
        )
    return request


def input_pending(run: Run) -> InputRequest | None:
    """The question the run waits on, if it is waiting for one."""
    if run.status != Run.Status.AWAITING_INPUT:
        return None
    return (
        InputRequest.objects.filter(run=run, status=InputRequest.Status.PENDING)
        .order_by("-requested_at")
        .first()
    )


def inputs_expire(*, now: Any = None) -> int:
    """Expire questions past their deadline and wake their runs, which end timed_out.

    The beat safety net (``runs.inputs_expire``). Run row first, question second, as in
    ``input_answer``, so expiry racing an answer cannot deadlock. A question whose run is
    no longer waiting for it (the run was cancelled) is voided instead.
    """
    now = now or timezone.now()
    expired = 0
    for request_id, run_id in InputRequest.objects.filter(
        status=InputRequest.Status.PENDING, expires_at__lt=now
    ).values_list("pk", "run_id")[:200]:
        with transaction.atomic():
            run = Run.objects.select_for_update().select_related("task").get(pk=run_id)
            request = (
                InputRequest.objects.select_for_update()
                .filter(pk=request_id, status=InputRequest.Status.PENDING)
                .first()
            )
            if request is None:
                continue
            waiting = run.status == Run.Status.AWAITING_INPUT
            request.status = InputRequest.Status.EXPIRED if waiting else InputRequest.Status.VOID
            # The wait ends here for the wall-clock budget too.
            request.answered_at = now
            request.save(update_fields=["status", "answered_at"])
            if not waiting:
                continue
            dispatch.run_wake_on_commit(run_id=run.id, step_no=run.step_no, status=run.status)
            event_record(
                task=run.task,
                run=run,
                type="agent.run.input.expired",
                data={"question_id": str(request.id), "expired_at": request.expires_at.isoformat()},
            )
            expired += 1
    return expired


def _reply_target(task: Task) -> tuple[str, int, bool] | None:
    """(provider, number, merge request?) of the thread a webhook task came from: its
    open pull request if it has one, else its issue."""
    ref = task.source_ref or {}
    provider = ref.get("provider")
    if task.source != Task.Source.WEBHOOK or provider not in ("github", "gitlab"):
        return None
    pr = PullRequest.objects.filter(task=task, state=PullRequest.State.OPEN).first()
    if pr is not None and pr.number:
        return provider, int(pr.number), provider == "gitlab"
    number = ref.get("issue_number")
    return (provider, int(number), False) if isinstance(number, int) else None


def input_notify_enqueue(*, task: Task, request: InputRequest) -> None:
    """Queue the comment that asks on the task's thread (webhook tasks only); call in
    the transaction that records the question."""
    target = _reply_target(task)
    if target is None:
        return
    work_enqueue(
        kind=INPUT_NOTIFY, key=f"input:{request.pk}", args={"question_id": str(request.pk)}
    )


def input_comment_body(request: InputRequest) -> str:
    if request.kind == InputRequest.Kind.PLAN:
        how = (
            "Reply `/agent plan accept`, `/agent plan reject <why>` or "
            "`/agent plan edit` followed by the plan to follow."
        )
        text = f"The agent's plan waits for review:\n\n{request.question}\n\n{how}"
    else:
        choices = "".join(f"\n- {choice}" for choice in request.choices)
        text = (
            f"The agent asks:\n\n> {request.question}\n{choices}\n\n"
            "Reply `/agent answer <your answer>` to let it go on."
        )
    return f"{text}\n\n{NOTIFY_MARKER.format(id=request.pk)}"


def input_notify_send(*, question_id: str) -> str:
    """The ``run.input.notify`` work item: post the question on the task's thread."""
    request = InputRequest.objects.select_related("run__task").filter(pk=question_id).first()
    if request is None or request.status != InputRequest.Status.PENDING:
        return "no longer pending"
    task = request.run.task
    target = _reply_target(task)
    if target is None:
        return "no thread"
    provider, number, merge_request = target
    repository = Repository.objects.get(pk=task.repository_id)
    try:
        git_provider_for(provider).comment_post(
            repository=repository,
            number=number,
            body=input_comment_body(request),
            merge_request=merge_request,
        )
    except GitProviderError as exc:
        if exc.retryable:
            raise
        raise PermanentWorkError(str(exc)) from exc
    log.info("run.input_notified", run_id=str(request.run_id), number=number)
    return "sent"
