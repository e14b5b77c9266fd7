"""Answers written as comments: ``/agent answer <text>`` to the question a run asked,
``/agent plan accept|reject [why]|edit <plan>`` to a plan under review.

As for approvals (webhooks.decisions), the comment answers as the platform user its
author's provider account is linked to, through the same service call as the API and
the console (runs.waiting.input_answer), so one policy holds on every path. A refusal
is answered on the thread by a work item. A redelivered comment is acted on once: the
comment's key is claimed before anything happens (webhooks.processing).
"""

from __future__ import annotations

from runs.models import InputRequest, Repository, Run
from runs.services import CommandRefused
from runs.waiting import input_answer, input_pending
from webhooks.decisions import CommentAuthor, ReplyTo, comment_refused, commenter_user

ANSWER_VERBS = frozenset({"answer", "plan"})


def comment_answer(
    *,
    run: Run,
    repository: Repository,
    provider: str,
    verb: str,
    args: str,
    author: CommentAuthor,
    reply: ReplyTo,
) -> tuple[bool, str]:
    """Answer the run's pending question as the comment's author; (done, reason)."""
    user, refusal = commenter_user(
        repository=repository,
        provider=provider,
        author=author,
        reply=reply,
        verb=verb,
        purpose="answer",
    )
    if refusal is not None:
        return refusal
    request = input_pending(run) or run.input_requests.order_by("-requested_at").first()
    if request is None:
        return comment_refused(reply, verb, "no_question", f"run {run.run_no} asked nothing")
    answer, decision = args.strip(), ""
    if verb == "plan" and answer:
        word, *rest = answer.split(None, 1)
        decision, answer = word.lower(), (rest[0].strip() if rest else "")
    is_plan = request.kind == InputRequest.Kind.PLAN
    malformed = (verb == "plan" or is_plan) and (
        not is_plan or decision not in InputRequest.Decision.values
    )
    # An answered question is refused as answered, whatever the comment says.
    if malformed and request.status == InputRequest.Status.PENDING:
        return comment_refused(
            reply, verb, "invalid_answer", "use /agent plan accept|reject|edit on a plan"
        )
    try:
        input_answer(
            run=run,
            question_id=request.pk,
            answer=answer,
            decision=decision,
            by=user.get_username(),
            user=user,
            via="comment",
        )
    except CommandRefused as refused:
        return comment_refused(reply, verb, refused.code, refused.message)
    return True, f"/agent {verb} by {user.get_username()} on run {run.run_no}"
