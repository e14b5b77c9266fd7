"""Processing: map a recorded delivery to orchestrator commands, exactly once.

A receipt is processed under its row lock in one transaction with every command it
causes and the semantic keys that guard them, so a duplicated message waits and then
finds the receipt done, and a crash leaves nothing half-applied. Commands go through
``runs.services``; processing never sets a run's status.
"""

from __future__ import annotations

import hashlib
import re
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from jobs import tracing
from runs import priorities
from runs.models import PullRequest, Repository, Task
from runs.services import (
    CommandRefused,
    IdempotencyConflict,
    run_cancel_request,
    task_followup,
    task_submit,
)
from runs.state import ACTIVE
from runs.timeline import event_record
from webhooks import metrics
from webhooks.answers import ANSWER_VERBS, comment_answer
from webhooks.decisions import CommentAuthor, ReplyTo, comment_decide, written_at
from webhooks.intake import GITHUB, GITLAB, repository_external_id
from webhooks.logs import log
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


def _get(data: Any, *path: str, default: Any = None) -> Any:
    """``data[path[0]][path[1]]...``, or ``default`` where anything is missing."""
    for key in path:
        if not isinstance(data, dict) or data.get(key) is None:
            return default
        data = data[key]
    return data


def _combine(outcomes: Iterable[Outcome]) -> Outcome:
    results = list(outcomes)
    if not results:
        return Outcome.ignored("nothing to do")
    status = (
        WebhookReceipt.Status.PROCESSED.value
        if any(o.status == WebhookReceipt.Status.PROCESSED for o in results)
        else WebhookReceipt.Status.IGNORED.value
    )
    return Outcome(status, "; ".join(dict.fromkeys(o.reason for o in results))[:500])


def _for_each_repository(delivery: Delivery, act: Callable[[Repository], Outcome]) -> Outcome:
    if not delivery.repositories:
        return Outcome.ignored(
            f"no repository proved it owns {delivery.external_id or '(none)'}: a delivery acts "
            "only on repositories whose own webhook secret signed it"
        )
    return _combine(act(repository) for repository in delivery.repositories)


def _action_claim(*, delivery: Delivery, repository: Repository, key: str) -> bool:
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


def _agent_pr(
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


def _submit(
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


def _followup(*, task: Task, feedback: str, by: str) -> Outcome:
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


def _command_execute(*, delivery: Delivery, target: CommandTarget, args: str) -> Outcome:
    if not _action_claim(delivery=delivery, repository=target.repository, key=target.comment_key):
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
        return _followup(task=target.pull_request.task, feedback=instruction, by=target.by)
    text = f"{instruction}\n\n{target.issue_context}".strip()
    return _submit(
        repository=target.repository,
        instruction=text,
        key=f"{target.comment_key}",
        by=target.by,
        source_ref=target.source_ref,
    )


# --- GitHub ------------------------------------------------------------------------------------


def _github_issue_key(full_name: str, number: Any) -> str:
    return f"github:issue:{full_name}#{number}"


def github_issues(delivery: Delivery) -> Outcome:
    if delivery.action != "labeled":
        return Outcome.ignored(f"issues.{delivery.action} is not handled")
    label = _get(delivery.payload, "label", "name", default="")
    if label != settings.WEBHOOK_AGENT_LABEL:
        return Outcome.ignored(f"label {label!r} is not {settings.WEBHOOK_AGENT_LABEL!r}")
    issue = delivery.payload.get("issue") or {}
    full_name, number = delivery.external_id, issue.get("number")
    instruction = f"{issue.get('title') or ''}\n\n{issue.get('body') or ''}".strip()
    by = f"github:{_get(delivery.payload, 'sender', 'login', default='')}"
    source_ref = {
        "provider": GITHUB,
        "repo": full_name,
        "issue_number": number,
        "url": issue.get("html_url", ""),
    }
    return _for_each_repository(
        delivery,
        lambda repository: _submit(
            repository=repository,
            instruction=instruction,
            key=_github_issue_key(full_name, number),
            by=by,
            source_ref=source_ref,
            priority=priorities.from_labels(
                [str(x.get("name")) for x in issue.get("labels") or [] if isinstance(x, dict)]
            ),
        ),
    )


def github_issue_comment(delivery: Delivery) -> Outcome:
    if delivery.action != "created":
        return Outcome.ignored(f"issue_comment.{delivery.action} is not handled")
    comment = delivery.payload.get("comment") or {}
    match = COMMAND.match(comment.get("body") or "")
    if match is None:
        return Outcome.ignored("not an /agent command")
    login = _get(comment, "user", "login", default="")
    association = comment.get("author_association", "NONE")
    if association not in WRITE_ASSOCIATIONS:
        return Outcome.ignored(f"{login} ({association}) has no write access")
    issue = delivery.payload.get("issue") or {}
    number = issue.get("number")
    full_name = delivery.external_id

    def act(repository: Repository) -> Outcome:
        pr = _agent_pr(repository, numbers=[number]) if "pull_request" in issue else None
        target = CommandTarget(
            repository=repository,
            by=f"github:{login}",
            comment_key=f"github:comment:{full_name}:{comment.get('id')}",
            pull_request=pr,
            issue_task_key=_github_issue_key(full_name, number),
            issue_context=(
                f"Issue #{number}: {issue.get('title') or ''}\n\n{issue.get('body') or ''}"
            ),
            source_ref={
                "provider": GITHUB,
                "repo": full_name,
                "issue_number": number,
                "comment_id": comment.get("id"),
                "url": comment.get("html_url", ""),
            },
            author=CommentAuthor(
                external_user_id=str(_get(comment, "user", "id", default="")),
                name=f"github:{login}",
                written_at=written_at(comment.get("created_at")),
            ),
            reply=ReplyTo(
                repository_id=repository.pk,
                provider=GITHUB,
                number=number if isinstance(number, int) else None,
                merge_request=False,
                key=f"github:comment:{full_name}:{comment.get('id')}",
            ),
        )
        return _command_execute(delivery=delivery, target=target, args=match["args"])

    return _for_each_repository(delivery, act)


def _github_review_feedback(
    delivery: Delivery, *, key: str, feedback: str, author: dict[str, Any]
) -> Outcome:
    login = _get(author, "user", "login", default="")
    association = author.get("author_association", "NONE")
    if association not in WRITE_ASSOCIATIONS:
        return Outcome.ignored(f"{login} ({association}) has no write access")
    pull = delivery.payload.get("pull_request") or {}

    def act(repository: Repository) -> Outcome:
        pr = _agent_pr(
            repository, branch=_get(pull, "head", "ref", default=""), numbers=[pull.get("number")]
        )
        if pr is None:
            return Outcome.ignored("not an agent pull request")
        if not _action_claim(delivery=delivery, repository=repository, key=key):
            return Outcome.ignored("already acted on")
        return _followup(task=pr.task, feedback=feedback, by=f"github:{login}")

    return _for_each_repository(delivery, act)


def github_pull_request_review(delivery: Delivery) -> Outcome:
    review = delivery.payload.get("review") or {}
    state = str(review.get("state") or "").lower()
    if delivery.action != "submitted" or state != "changes_requested":
        return Outcome.ignored(f"review {delivery.action}/{state or '-'} is not handled")
    feedback = (
        f"Review by {_get(review, 'user', 'login', default='')} requested changes:\n"
        f"{review.get('body') or ''}"
    ).strip()
    return _github_review_feedback(
        delivery, key=f"github:review:{review.get('id')}", feedback=feedback, author=review
    )


def github_pull_request_review_comment(delivery: Delivery) -> Outcome:
    if delivery.action != "created":
        return Outcome.ignored(f"pull_request_review_comment.{delivery.action} is not handled")
    comment = delivery.payload.get("comment") or {}
    where = f"{comment.get('path', '')}:{comment.get('line') or comment.get('original_line') or ''}"
    feedback = f"Review comment on {where}:\n{comment.get('body') or ''}"
    return _github_review_feedback(
        delivery,
        key=f"github:review_comment:{comment.get('id')}",
        feedback=feedback,
        author=comment,
    )


def _pull_request_state(
    *, repository: Repository, pr: PullRequest, state: str, by: str, head_sha: str = ""
) -> Outcome:
    """Record a provider-side PR state change and what it means for the task."""
    locked = PullRequest.objects.select_for_update().select_related("task").get(pk=pr.pk)
    task = locked.task
    if state == PullRequest.State.OPEN and head_sha:
        if locked.head_sha == head_sha:
            return Outcome.ignored("head commit already known")
        PullRequest.objects.filter(pk=pr.pk).update(head_sha=head_sha, updated_at=timezone.now())
        return Outcome.done(f"pull request #{locked.number} head is now {head_sha[:12]}")
    if locked.state == state:
        return Outcome.ignored(f"pull request #{locked.number} already {state}")
    PullRequest.objects.filter(pk=pr.pk).update(state=state, updated_at=timezone.now())
    run = locked.last_run or task.runs.order_by("-run_no").first()
    event_type = {
        "merged": "agent.pr.merged",
        "closed": "agent.pr.closed",
        "open": "agent.pr.updated",
    }[state]
    event_record(
        task=task,
        run=run,
        type=event_type,
        data={"number": locked.number, "url": locked.url, "state": state, "by": by},
        actor=by,
    )
    if state == PullRequest.State.OPEN:
        return Outcome.done(f"pull request #{locked.number} reopened")
    active = task.runs.filter(status__in=ACTIVE).order_by("-run_no").first()
    # Feedback waiting for a follow-up no longer has a PR to go to.
    Task.objects.filter(pk=task.pk).update(pending_feedback="")
    if active is not None and state == PullRequest.State.CLOSED:
        run_cancel_request(run=active, by=by, reason="pull request closed without merge")
        return Outcome.done(
            f"pull request #{locked.number} closed; run {active.run_no} cancellation requested"
        )
    if active is None:
        Task.objects.filter(pk=task.pk).update(
            status=Task.Status.COMPLETED if state == "merged" else Task.Status.CANCELLED,
            status_reason=f"pull request #{locked.number} {state}"[:500],
            updated_at=timezone.now(),
        )
    return Outcome.done(f"pull request #{locked.number} {state}")


def github_pull_request(delivery: Delivery) -> Outcome:
    pull = delivery.payload.get("pull_request") or {}
    by = f"github:{_get(delivery.payload, 'sender', 'login', default='')}"
    if delivery.action == "closed":
        state, head_sha = ("merged" if pull.get("merged") else "closed"), ""
    elif delivery.action == "reopened":
        state, head_sha = "open", ""
    elif delivery.action == "synchronize":
        state, head_sha = "open", str(_get(pull, "head", "sha", default=""))
    else:
        return Outcome.ignored(f"pull_request.{delivery.action} is not handled")

    def act(repository: Repository) -> Outcome:
        pr = _agent_pr(
            repository, branch=_get(pull, "head", "ref", default=""), numbers=[pull.get("number")]
        )
        if pr is None:
            return Outcome.ignored("not an agent pull request")
        return _pull_request_state(
            repository=repository, pr=pr, state=state, by=by, head_sha=head_sha
        )

    return _for_each_repository(delivery, act)


@dataclass
class CiReport:
    kind: str
    external_id: str
    head_sha: str
    head_branch: str
    numbers: list[object]  # as sent; _agent_pr keeps only the ints
    name: str
    conclusion: str
    summary: str
    url: str


def _ci_record(delivery: Delivery, report: CiReport) -> Outcome:
    def act(repository: Repository) -> Outcome:
        pr = _agent_pr(repository, branch=report.head_branch, numbers=report.numbers)
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
        return _ci_followup(pr=pr, result=result)

    return _for_each_repository(delivery, act)


def _ci_followup(*, pr: PullRequest, result: CiResult) -> Outcome:
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
    return _followup(task=locked.task, feedback=feedback, by=f"{result.provider}:ci")


def github_ci(delivery: Delivery) -> Outcome:
    event = delivery.receipt.event
    if delivery.action != "completed":
        return Outcome.ignored(f"{event}.{delivery.action} is not handled")
    obj = delivery.payload.get(event) or {}
    if event == "check_run":
        output = obj.get("output") or {}
        name = str(obj.get("name") or "")
        branch = _get(obj, "check_suite", "head_branch", default="")
        summary = "\n".join(filter(None, [output.get("title"), output.get("summary")]))
    elif event == "check_suite":
        name = str(_get(obj, "app", "name", default="") or "check suite")
        branch, summary = obj.get("head_branch") or "", ""
    else:
        name = str(obj.get("name") or obj.get("display_title") or "workflow")
        branch, summary = obj.get("head_branch") or "", ""
    report = CiReport(
        kind=event,
        external_id=str(obj.get("id", "")),
        head_sha=str(obj.get("head_sha") or ""),
        head_branch=str(branch or ""),
        numbers=[p.get("number") for p in obj.get("pull_requests") or [] if isinstance(p, dict)],
        name=name,
        conclusion=str(obj.get("conclusion") or ""),
        summary=summary[:4000],
        url=str(obj.get("html_url") or obj.get("details_url") or ""),
    )
    return _ci_record(delivery, report)


def github_ping(delivery: Delivery) -> Outcome:
    return Outcome.done(f"ping from hook {delivery.payload.get('hook_id', '')}")


GITHUB_HANDLERS: dict[str, Callable[[Delivery], Outcome]] = {
    "ping": github_ping,
    "issues": github_issues,
    "issue_comment": github_issue_comment,
    "pull_request": github_pull_request,
    "pull_request_review": github_pull_request_review,
    "pull_request_review_comment": github_pull_request_review_comment,
    "check_suite": github_ci,
    "check_run": github_ci,
    "workflow_run": github_ci,
}


# --- GitLab ------------------------------------------------------------------------------------


def _gitlab_issue_key(path: str, iid: Any) -> str:
    return f"gitlab:issue:{path}#{iid}"


def _gitlab_labels(labels: Any) -> list[str]:
    return [str(label.get("title")) for label in labels or [] if isinstance(label, dict)]


def gitlab_issue(delivery: Delivery) -> Outcome:
    attrs = delivery.payload.get("object_attributes") or {}
    action = attrs.get("action", "")
    label = settings.WEBHOOK_AGENT_LABEL
    current = _gitlab_labels(delivery.payload.get("labels") or attrs.get("labels"))
    changes = _get(delivery.payload, "changes", "labels", default=None)
    if changes is not None:
        added = label in _gitlab_labels(changes.get("current")) and label not in _gitlab_labels(
            changes.get("previous")
        )
    else:
        added = action == "open" and label in current
    if not added:
        return Outcome.ignored(f"issue {action or '-'} did not add the {label!r} label")
    path, iid = delivery.external_id, attrs.get("iid")
    instruction = f"{attrs.get('title') or ''}\n\n{attrs.get('description') or ''}".strip()
    by = f"gitlab:{_get(delivery.payload, 'user', 'username', default='')}"
    source_ref = {
        "provider": GITLAB,
        "repo": path,
        "issue_number": iid,
        "url": attrs.get("url", ""),
    }
    return _for_each_repository(
        delivery,
        lambda repository: _submit(
            repository=repository,
            instruction=instruction,
            key=_gitlab_issue_key(path, iid),
            by=by,
            source_ref=source_ref,
            priority=priorities.from_labels(current),
        ),
    )


def _gitlab_noteable_iid(noteable: Any, mr: dict[str, Any], issue: dict[str, Any]) -> int | None:
    iid = (mr if noteable == "MergeRequest" else issue).get("iid")
    return iid if isinstance(iid, int) else None


def gitlab_note(delivery: Delivery) -> Outcome:
    attrs = delivery.payload.get("object_attributes") or {}
    match = COMMAND.match(attrs.get("note") or "")
    if match is None:
        return Outcome.ignored("not an /agent command")
    username = _get(delivery.payload, "user", "username", default="")
    # Note payloads carry no access level; an allow-list stands in for write access.
    if username not in settings.GITLAB_COMMAND_USERS:
        return Outcome.ignored(f"{username} is not in GITLAB_COMMAND_USERS")
    path = delivery.external_id
    noteable = attrs.get("noteable_type")
    mr = delivery.payload.get("merge_request") or {}
    issue = delivery.payload.get("issue") or {}

    def act(repository: Repository) -> Outcome:
        pr = None
        if noteable == "MergeRequest":
            pr = _agent_pr(
                repository, branch=mr.get("source_branch") or "", numbers=[mr.get("iid")]
            )
        target = CommandTarget(
            repository=repository,
            by=f"gitlab:{username}",
            comment_key=f"gitlab:note:{path}:{attrs.get('id')}",
            pull_request=pr,
            issue_task_key=_gitlab_issue_key(path, issue.get("iid")),
            issue_context=(
                f"Issue #{issue.get('iid')}: {issue.get('title') or ''}\n\n"
                f"{issue.get('description') or ''}"
                if issue
                else ""
            ),
            source_ref={
                "provider": GITLAB,
                "repo": path,
                "note_id": attrs.get("id"),
                "issue_number": issue.get("iid"),
                "url": attrs.get("url", ""),
            },
            author=CommentAuthor(
                external_user_id=str(
                    _get(delivery.payload, "user", "id", default="") or attrs.get("author_id") or ""
                ),
                name=f"gitlab:{username}",
                written_at=written_at(attrs.get("created_at")),
            ),
            reply=ReplyTo(
                repository_id=repository.pk,
                provider=GITLAB,
                number=_gitlab_noteable_iid(noteable, mr, issue),
                merge_request=noteable == "MergeRequest",
                key=f"gitlab:note:{path}:{attrs.get('id')}",
            ),
        )
        return _command_execute(delivery=delivery, target=target, args=match["args"])

    return _for_each_repository(delivery, act)


def gitlab_merge_request(delivery: Delivery) -> Outcome:
    attrs = delivery.payload.get("object_attributes") or {}
    action = attrs.get("action", "")
    by = f"gitlab:{_get(delivery.payload, 'user', 'username', default='')}"
    if action == "merge":
        state, head_sha = "merged", ""
    elif action == "close":
        state, head_sha = "closed", ""
    elif action == "reopen":
        state, head_sha = "open", ""
    elif action == "update" and attrs.get("oldrev"):
        state, head_sha = "open", str(_get(attrs, "last_commit", "id", default=""))
    else:
        return Outcome.ignored(f"merge request {action or '-'} is not handled")

    def act(repository: Repository) -> Outcome:
        pr = _agent_pr(
            repository, branch=attrs.get("source_branch") or "", numbers=[attrs.get("iid")]
        )
        if pr is None:
            return Outcome.ignored("not an agent merge request")
        return _pull_request_state(
            repository=repository, pr=pr, state=state, by=by, head_sha=head_sha
        )

    return _for_each_repository(delivery, act)


def gitlab_pipeline(delivery: Delivery) -> Outcome:
    attrs = delivery.payload.get("object_attributes") or {}
    status = str(attrs.get("status") or "")
    if status not in {"success", "failed", "canceled", "skipped"}:
        return Outcome.ignored(f"pipeline {status or '-'} is not finished")
    mr = delivery.payload.get("merge_request") or {}
    failed_jobs = [
        f"{b.get('stage')}/{b.get('name')}: {b.get('status')}"
        for b in delivery.payload.get("builds") or []
        if isinstance(b, dict) and b.get("status") == "failed"
    ]
    report = CiReport(
        kind=CiResult.Kind.PIPELINE,
        external_id=str(attrs.get("id", "")),
        head_sha=str(attrs.get("sha") or ""),
        head_branch=str(mr.get("source_branch") or attrs.get("ref") or ""),
        numbers=[mr["iid"]] if isinstance(mr.get("iid"), int) else [],
        name=f"pipeline {attrs.get('id', '')}",
        conclusion=status,
        summary="\n".join(sorted(failed_jobs))[:4000],
        url=str(attrs.get("url") or ""),
    )
    return _ci_record(delivery, report)


GITLAB_HANDLERS: dict[str, Callable[[Delivery], Outcome]] = {
    "issue": gitlab_issue,
    "note": gitlab_note,
    "merge_request": gitlab_merge_request,
    "pipeline": gitlab_pipeline,
}


# --- the receipt -----------------------------------------------------------------------------


def _repositories(receipt: WebhookReceipt) -> list[Repository]:
    """The repositories whose own secret verified the delivery (docs/design.md §9: a delivery
    reaches only repositories that proved they own it); a receipt naming none, as one
    recorded before routing required that proof, reaches nobody."""
    if not receipt.repository_ids:
        return []
    rows = Repository.objects.filter(pk__in=receipt.repository_ids)
    return list(rows.select_related("workspace").order_by("pk"))


def webhook_route(*, receipt: WebhookReceipt) -> Outcome:
    """The outcome of one delivery's commands; runs inside the caller's transaction."""
    delivery = Delivery(receipt=receipt, repositories=_repositories(receipt))
    if receipt.provider == GITHUB:
        handler = GITHUB_HANDLERS.get(receipt.event)
    else:
        handler = GITLAB_HANDLERS.get(str(receipt.payload.get("object_kind") or ""))
    if handler is None:
        return Outcome.ignored(f"event {receipt.event!r} is recorded, not handled")
    return handler(delivery)


def webhook_receipt_process(*, receipt_id: int) -> str:
    """Process a receipt once: a processed or ignored receipt is left alone.

    The receipt row stays locked for the whole transaction, so a duplicated message
    waits and then finds it done. On error everything rolls back, the receipt is marked
    failed with the error and the exception propagates for the task to retry.
    """
    started = time.monotonic()
    try:
        with transaction.atomic():
            receipt = WebhookReceipt.objects.select_for_update().filter(pk=receipt_id).first()
            if receipt is None:
                return "missing"
            if receipt.status in (WebhookReceipt.Status.PROCESSED, WebhookReceipt.Status.IGNORED):
                return receipt.status
            tracing.trace_activate((receipt.headers or {}).get("traceparent"))
            outcome = webhook_route(receipt=receipt)
            now = timezone.now()
            WebhookReceipt.objects.filter(pk=receipt_id).update(
                status=outcome.status,
                status_reason=outcome.reason[:500],
                error="",
                attempts=F("attempts") + 1,
                last_attempt_at=now,
                processed_at=now,
                processing_ms=int((time.monotonic() - started) * 1000),
            )
    except Exception as exc:
        WebhookReceipt.objects.filter(pk=receipt_id).update(
            status=WebhookReceipt.Status.FAILED,
            error=traceback.format_exc()[-10000:],
            status_reason=f"{type(exc).__name__}: {exc}"[:500],
            attempts=F("attempts") + 1,
            last_attempt_at=timezone.now(),
            processing_ms=int((time.monotonic() - started) * 1000),
        )
        provider = (
            WebhookReceipt.objects.filter(pk=receipt_id).values_list("provider", flat=True).first()
            or "unknown"
        )
        metrics.processed.labels(provider=provider, status="failed").inc()
        log.error("webhook.process_failed", receipt_id=receipt_id, error=str(exc)[:300])
        raise
    elapsed = time.monotonic() - started
    metrics.processed.labels(provider=receipt.provider, status=outcome.status).inc()
    metrics.processing_seconds.labels(provider=receipt.provider).observe(elapsed)
    log.info(
        "webhook.processed",
        receipt_id=receipt_id,
        webhook_event=receipt.event,
        action=receipt.action,
        status=outcome.status,
        reason=outcome.reason[:200],
    )
    return outcome.status
