"""GitHub deliveries: one handler per event type (``GITHUB_HANDLERS``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings

from runs import priorities
from runs.models import Repository
from webhooks.decisions import CommentAuthor, ReplyTo, written_at
from webhooks.intake import GITHUB
from webhooks.mapping import (
    COMMAND,
    WRITE_ASSOCIATIONS,
    CiReport,
    CommandTarget,
    Delivery,
    Outcome,
    action_claim,
    agent_pr,
    ci_record,
    command_execute,
    delivery_followup,
    delivery_submit,
    for_each_repository,
    payload_get,
    pull_request_state,
)


def _github_issue_key(full_name: str, number: Any) -> str:
    return f"github:issue:{full_name}#{number}"


def github_issues(delivery: Delivery) -> Outcome:
    if delivery.action != "labeled":
        return Outcome.ignored(f"issues.{delivery.action} is not handled")
    label = payload_get(delivery.payload, "label", "name", default="")
    if label != settings.WEBHOOK_AGENT_LABEL:
        return Outcome.ignored(f"label {label!r} is not {settings.WEBHOOK_AGENT_LABEL!r}")
    issue = delivery.payload.get("issue") or {}
    full_name, number = delivery.external_id, issue.get("number")
    instruction = f"{issue.get('title') or ''}\n\n{issue.get('body') or ''}".strip()
    by = f"github:{payload_get(delivery.payload, 'sender', 'login', default='')}"
    source_ref = {
        "provider": GITHUB,
        "repo": full_name,
        "issue_number": number,
        "url": issue.get("html_url", ""),
    }
    return for_each_repository(
        delivery,
        lambda repository: delivery_submit(
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
    login = payload_get(comment, "user", "login", default="")
    association = comment.get("author_association", "NONE")
    if association not in WRITE_ASSOCIATIONS:
        return Outcome.ignored(f"{login} ({association}) has no write access")
    issue = delivery.payload.get("issue") or {}
    number = issue.get("number")
    full_name = delivery.external_id

    def act(repository: Repository) -> Outcome:
        pr = agent_pr(repository, numbers=[number]) if "pull_request" in issue else None
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
                external_user_id=str(payload_get(comment, "user", "id", default="")),
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
        return command_execute(delivery=delivery, target=target, args=match["args"])

    return for_each_repository(delivery, act)


def _github_review_feedback(
    delivery: Delivery, *, key: str, feedback: str, author: dict[str, Any]
) -> Outcome:
    login = payload_get(author, "user", "login", default="")
    association = author.get("author_association", "NONE")
    if association not in WRITE_ASSOCIATIONS:
        return Outcome.ignored(f"{login} ({association}) has no write access")
    pull = delivery.payload.get("pull_request") or {}

    def act(repository: Repository) -> Outcome:
        pr = agent_pr(
            repository,
            branch=payload_get(pull, "head", "ref", default=""),
            numbers=[pull.get("number")],
        )
        if pr is None:
            return Outcome.ignored("not an agent pull request")
        if not action_claim(delivery=delivery, repository=repository, key=key):
            return Outcome.ignored("already acted on")
        return delivery_followup(task=pr.task, feedback=feedback, by=f"github:{login}")

    return for_each_repository(delivery, act)


def github_pull_request_review(delivery: Delivery) -> Outcome:
    review = delivery.payload.get("review") or {}
    state = str(review.get("state") or "").lower()
    if delivery.action != "submitted" or state != "changes_requested":
        return Outcome.ignored(f"review {delivery.action}/{state or '-'} is not handled")
    feedback = (
        f"Review by {payload_get(review, 'user', 'login', default='')} requested changes:\n"
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


def github_pull_request(delivery: Delivery) -> Outcome:
    pull = delivery.payload.get("pull_request") or {}
    by = f"github:{payload_get(delivery.payload, 'sender', 'login', default='')}"
    if delivery.action == "closed":
        state, head_sha = ("merged" if pull.get("merged") else "closed"), ""
    elif delivery.action == "reopened":
        state, head_sha = "open", ""
    elif delivery.action == "synchronize":
        state, head_sha = "open", str(payload_get(pull, "head", "sha", default=""))
    else:
        return Outcome.ignored(f"pull_request.{delivery.action} is not handled")

    def act(repository: Repository) -> Outcome:
        pr = agent_pr(
            repository,
            branch=payload_get(pull, "head", "ref", default=""),
            numbers=[pull.get("number")],
        )
        if pr is None:
            return Outcome.ignored("not an agent pull request")
        return pull_request_state(
            repository=repository, pr=pr, state=state, by=by, head_sha=head_sha
        )

    return for_each_repository(delivery, act)


def github_ci(delivery: Delivery) -> Outcome:
    event = delivery.receipt.event
    if delivery.action != "completed":
        return Outcome.ignored(f"{event}.{delivery.action} is not handled")
    obj = delivery.payload.get(event) or {}
    if event == "check_run":
        output = obj.get("output") or {}
        name = str(obj.get("name") or "")
        branch = payload_get(obj, "check_suite", "head_branch", default="")
        summary = "\n".join(filter(None, [output.get("title"), output.get("summary")]))
    elif event == "check_suite":
        name = str(payload_get(obj, "app", "name", default="") or "check suite")
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
    return ci_record(delivery, report)


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
