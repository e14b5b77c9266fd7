"""Mapping a recorded delivery to orchestrator commands: the outcome of a delivery, the
claims that make each action happen once, and the commands (submit, follow up, ``/agent``)
shared by the providers' handlers (``webhooks.github``, ``webhooks.gitlab``). Commands go
through ``runs.services``; a run's or a task's status is never set here."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from runs.models import PullRequest, Repository, Task
from runs.services import (
    CommandRefused,
    IdempotencyConflict,
    run_cancel_request,
    task_followup,
    task_submit,
)
from runs.services.pull_requests import pull_request_state_record
from webhooks.answers import ANSWER_VERBS, comment_answer
from webhooks.decisions import CommentAuthor, ReplyTo, comment_decide
from webhooks.intake import repository_external_id
from webhooks.models import CiResult, WebhookAction, WebhookReceipt

# GitHub's author_association values that mean write access to the repository.
WRITE_ASSOCIATIONS = frozenset({"OWNER", "MEMBER", "COLLABORATOR"})
CI_FAILURES = frozenset({"failure", "timed_out", "startup_failure", "failed"})
COMMAND = re.compile(r"^\s*/agent\b[ \t]*(?P<args>.*)", re.DOTALL)


@dataclass
class Outcome:
    status: str
    reason: str

    @classmethod
    def done(cls, reason: str) -> Outcome:
        return cls(WebhookReceipt.Status.PROCESSED.value, reason)

    @classmethod
    def ignored(cls, reason: str) -> Outcome:
        return cls(WebhookReceipt.Status.IGNORED.value, reason)


@dataclass
class Delivery:
    receipt: WebhookReceipt
    repositories: list[Repository]

    @property
    def provider(self) -> str:
        return self.receipt.provider

    @property
    def payload(self) -> dict[str, Any]:
        return self.receipt.payload

    @property
    def action(self) -> str:
        return self.receipt.action

    @property
    def external_id(self) -> str:
        return repository_external_id(self.provider, self.payload)


def payload_get(data: Any, *path: str, default: Any = None) -> Any:
    """``data[path[0]][path[1]]...``, or ``default`` where anything is missing."""
    for key in path:
        if not isinstance(data, dict) or data.get(key) is None:
            return default
        data = data[key]
    return data


def outcomes_combine(outcomes: Iterable[Outcome]) -> Outcome:
    results = list(outcomes)
    if not results:
        return Outcome.ignored("nothing to do")
    status = (
        WebhookReceipt.Status.PROCESSED.value
        if any(o.status == WebhookReceipt.Status.PROCESSED for o in results)
        else WebhookReceipt.Status.IGNORED.value
    )
    return Outcome(status, "; ".join(dict.fromkeys(o.reason for o in results))[:500])


def for_each_repository(delivery: Delivery, act: Callable[[Repository], Outcome]) -> Outcome:
    if not delivery.repositories:
        return Outcome.ignored(
            f"no repository proved it owns {delivery.external_id or '(none)'}: a delivery acts "
            "only on repositories whose own webhook secret signed it"
        )
    return outcomes_combine(act(repository) for repository in delivery.repositories)


def action_claim(*, delivery: Delivery, repository: Repository, key: str) -> bool:
    """Insert the semantic key; False if another delivery already acted on it.

    A concurrent delivery with the same key blocks on the unique index until this
    transaction ends, then fails here: the command below it runs once.
    """
    try:
        with transaction.atomic():
            WebhookAction.objects.create(
                provider=delivery.provider,
                key=f"{repository.pk}:{key}"[:300],
                receipt=delivery.receipt,
            )
    except IntegrityError:
        return False
    return True


def agent_pr(
    repository: Repository, *, branch: str = "", numbers: Iterable[object] = ()
) -> PullRequest | None:
    """The agent's pull request in ``repository`` with this head branch or number."""
    rows = PullRequest.objects.filter(task__repository=repository).select_related("task")
    if branch:
        found = rows.filter(branch=branch).order_by("-created_at").first()
        if found is not None:
            return found
    wanted = [n for n in numbers if isinstance(n, int)]
    if wanted:
        return rows.filter(number__in=wanted).order_by("-created_at").first()
    return None


def delivery_submit(
    *,
    repository: Repository,
    instruction: str,
    key: str,
    by: str,
    source_ref: dict[str, Any],
    priority: int | None = None,
) -> Outcome:
    try:
        submission = task_submit(
            workspace=repository.workspace,
            repository=repository,
            instruction=instruction,
            source=Task.Source.WEBHOOK,
            priority=priority,
            requested_by=by,
            idempotency_key=key,
            model_options=dict(settings.WEBHOOK_TASK_MODEL_OPTIONS),
            source_ref=source_ref,
        )
    except IdempotencyConflict:
        return Outcome.ignored(f"a task for {key} already exists")
    except CommandRefused as refused:
        return Outcome.ignored(f"task refused: {refused.code}")
    if not submission.created:
        return Outcome.ignored(f"task {submission.task.id} already submitted for {key}")
    return Outcome.done(f"task {submission.task.id} submitted ({submission.task.status})")


def delivery_followup(*, task: Task, feedback: str, by: str) -> Outcome:
    try:
        run = task_followup(task=task, feedback=feedback, by=by)
    except CommandRefused as refused:
        return Outcome.ignored(f"follow-up refused: {refused.code}")
    if run is None:
        return Outcome.done(f"feedback batched for the next run of task {task.id}")
    return Outcome.done(f"follow-up run {run.run_no} of task {task.id} started")


# --- commands (/agent ...) -------------------------------------------------------------------


@dataclass
class CommandTarget:
    """What an ``/agent`` comment was written on."""

    repository: Repository
    by: str
    comment_key: str
    pull_request: PullRequest | None
    # The task of the issue the comment is on (one task per issue), if any.
    issue_task_key: str
    issue_context: str
    source_ref: dict[str, Any]
    author: CommentAuthor
    reply: ReplyTo


def command_execute(*, delivery: Delivery, target: CommandTarget, args: str) -> Outcome:
    if not action_claim(delivery=delivery, repository=target.repository, key=target.comment_key):
        return Outcome.ignored("comment already acted on")
    verb, _, rest = args.strip().partition(" ")
    verb = verb.lower()
    if verb in {"approve", "reject", "cancel", *ANSWER_VERBS}:
        task = (
            target.pull_request.task
            if target.pull_request
            else (
                Task.objects.filter(
                    workspace_id=target.repository.workspace_id,
                    repository=target.repository,
                    idempotency_key=target.issue_task_key,
                ).first()
            )
        )
        if task is None:
            return Outcome.ignored(f"/agent {verb}: no agent task here")
        run = task.runs.order_by("-run_no").first()
        if run is None:
            return Outcome.ignored(f"/agent {verb}: task {task.id} has no run")
        if verb in ANSWER_VERBS:
            done, reason = comment_answer(
                run=run,
                repository=target.repository,
                provider=delivery.provider,
                verb=verb,
                args=rest,
                author=target.author,
                reply=target.reply,
            )
            return Outcome.done(reason) if done else Outcome.ignored(reason)
        if verb in {"approve", "reject"}:
            done, reason = comment_decide(
                run=run,
                repository=target.repository,
                provider=delivery.provider,
                verb=verb,
                args=rest,
                author=target.author,
                reply=target.reply,
            )
            return Outcome.done(reason) if done else Outcome.ignored(reason)
        try:
            if not run_cancel_request(
                run=run, by=target.by, reason=rest.strip() or "cancelled from a comment"
            ):
                return Outcome.ignored(f"/agent cancel: run {run.run_no} already ended")
        except CommandRefused as refused:
            return Outcome.ignored(f"/agent {verb} refused: {refused.code}")
        return Outcome.done(f"/agent {verb} on run {run.run_no} of task {task.id}")
    instruction = args.strip()
    if not instruction:
        return Outcome.ignored("/agent without an instruction")
    if target.pull_request is not None:
        return delivery_followup(task=target.pull_request.task, feedback=instruction, by=target.by)
    text = f"{instruction}\n\n{target.issue_context}".strip()
    return delivery_submit(
        repository=target.repository,
        instruction=text,
        key=f"{target.comment_key}",
        by=target.by,
        source_ref=target.source_ref,
    )


def pull_request_state(
    *, repository: Repository, pr: PullRequest, state: str, by: str, head_sha: str = ""
) -> Outcome:
    """Record a provider-side PR state change through ``runs`` (its task's status is
    theirs to write)."""
    change = pull_request_state_record(pr=pr, state=state, by=by, head_sha=head_sha)
    return Outcome.done(change.reason) if change.changed else Outcome.ignored(change.reason)


@dataclass
class CiReport:
    kind: str
    external_id: str
    head_sha: str
    head_branch: str
    numbers: list[object]  # as sent; agent_pr keeps only the ints
    name: str
    conclusion: str
    summary: str
    url: str


def ci_record(delivery: Delivery, report: CiReport) -> Outcome:
    def act(repository: Repository) -> Outcome:
        pr = agent_pr(repository, branch=report.head_branch, numbers=report.numbers)
        if pr is None:
            return Outcome.ignored("CI result is not for an agent pull request")
        fingerprint = hashlib.sha256(
            f"{report.kind}|{report.name}|{report.conclusion}|{report.summary}".encode()
        ).hexdigest()
        result, created = CiResult.objects.get_or_create(
            repository=repository,
            provider=delivery.provider,
            kind=report.kind,
            external_id=report.external_id,
            head_sha=report.head_sha,
            conclusion=report.conclusion,
            defaults={
                "pull_request": pr,
                "head_branch": report.head_branch,
                "name": report.name[:300],
                "summary": report.summary,
                "url": report.url[:1000],
                "fingerprint": fingerprint,
                "receipt": delivery.receipt,
            },
        )
        if not created:
            return Outcome.ignored("CI result already recorded")
        if report.conclusion not in CI_FAILURES:
            return Outcome.done(f"CI {report.kind} {report.conclusion} recorded")
        return ci_followup(pr=pr, result=result)

    return for_each_repository(delivery, act)


def ci_followup(*, pr: PullRequest, result: CiResult) -> Outcome:
    """A follow-up run for a CI failure on the PR's head commit, within the budget."""
    # The PR row lock serialises concurrent failures of one PR, so the count and the
    # fingerprint check below cannot both pass for two of them.
    locked = PullRequest.objects.select_for_update().select_related("task").get(pk=pr.pk)
    if locked.head_sha and locked.head_sha != result.head_sha:
        return Outcome.done(f"CI failure recorded for {result.head_sha[:12]}, not the PR head")
    sent = CiResult.objects.filter(pull_request=locked, followup_requested=True)
    limit = settings.WEBHOOK_CI_FOLLOWUPS_PER_COMMIT
    if sent.filter(head_sha=result.head_sha).count() >= limit:
        return Outcome.done(f"CI failure recorded; {limit} follow-up(s) for this commit spent")
    if sent.filter(fingerprint=result.fingerprint).exists():
        return Outcome.done("CI failure recorded; the same failure already had a follow-up")
    CiResult.objects.filter(pk=result.pk).update(followup_requested=True)
    feedback = (
        f"CI {result.kind} {result.name!r} concluded {result.conclusion} on "
        f"{result.head_sha[:12]}.\n{result.summary}\n{result.url}"
    ).strip()
    return delivery_followup(task=locked.task, feedback=feedback, by=f"{result.provider}:ci")
