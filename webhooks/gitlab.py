"""GitLab deliveries: one handler per event type (``GITLAB_HANDLERS``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings

from runs import priorities
from runs.models import Repository
from webhooks.decisions import CommentAuthor, ReplyTo, written_at
from webhooks.intake import GITLAB
from webhooks.mapping import (
    COMMAND,
    CiReport,
    CommandTarget,
    Delivery,
    Outcome,
    agent_pr,
    ci_record,
    command_execute,
    delivery_submit,
    for_each_repository,
    payload_get,
    pull_request_state,
)
from webhooks.models import CiResult


def _gitlab_issue_key(path: str, iid: Any) -> str:
    return f"gitlab:issue:{path}#{iid}"


def _gitlab_labels(labels: Any) -> list[str]:
    return [str(label.get("title")) for label in labels or [] if isinstance(label, dict)]


def gitlab_issue(delivery: Delivery) -> Outcome:
    attrs = delivery.payload.get("object_attributes") or {}
    action = attrs.get("action", "")
    label = settings.WEBHOOK_AGENT_LABEL
    current = _gitlab_labels(delivery.payload.get("labels") or attrs.get("labels"))
    changes = payload_get(delivery.payload, "changes", "labels", default=None)
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
    by = f"gitlab:{payload_get(delivery.payload, 'user', 'username', default='')}"
    source_ref = {
        "provider": GITLAB,
        "repo": path,
        "issue_number": iid,
        "url": attrs.get("url", ""),
    }
    return for_each_repository(
        delivery,
        lambda repository: delivery_submit(
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
    username = payload_get(delivery.payload, "user", "username", default="")
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
            pr = agent_pr(repository, branch=mr.get("source_branch") or "", numbers=[mr.get("iid")])
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
                    payload_get(delivery.payload, "user", "id", default="")
                    or attrs.get("author_id")
                    or ""
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
        return command_execute(delivery=delivery, target=target, args=match["args"])

    return for_each_repository(delivery, act)


def gitlab_merge_request(delivery: Delivery) -> Outcome:
    attrs = delivery.payload.get("object_attributes") or {}
    action = attrs.get("action", "")
    by = f"gitlab:{payload_get(delivery.payload, 'user', 'username', default='')}"
    if action == "merge":
        state, head_sha = "merged", ""
    elif action == "close":
        state, head_sha = "closed", ""
    elif action == "reopen":
        state, head_sha = "open", ""
    elif action == "update" and attrs.get("oldrev"):
        state, head_sha = "open", str(payload_get(attrs, "last_commit", "id", default=""))
    else:
        return Outcome.ignored(f"merge request {action or '-'} is not handled")

    def act(repository: Repository) -> Outcome:
        pr = agent_pr(
            repository, branch=attrs.get("source_branch") or "", numbers=[attrs.get("iid")]
        )
        if pr is None:
            return Outcome.ignored("not an agent merge request")
        return pull_request_state(
            repository=repository, pr=pr, state=state, by=by, head_sha=head_sha
        )

    return for_each_repository(delivery, act)


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
    return ci_record(delivery, report)


GITLAB_HANDLERS: dict[str, Callable[[Delivery], Outcome]] = {
    "issue": gitlab_issue,
    "note": gitlab_note,
    "merge_request": gitlab_merge_request,
    "pipeline": gitlab_pipeline,
}
