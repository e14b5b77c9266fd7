"""A question the run waits on a person for: the agent's ``ask_user`` call or its plan
under review (docs/design.md §4, ``awaiting_input``)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from jobs.ids import new_id


class InputRequest(models.Model):
    """One question to a person; answered at most once.

    ``key`` names where it was asked (``step:turn:call`` of the ask, or ``plan``), so a
    step that runs again after a crash finds its question instead of asking twice.
    """

    class Kind(models.TextChoices):
        QUESTION = "question"
        PLAN = "plan"

    class Status(models.TextChoices):
        PENDING = "pending"
        ANSWERED = "answered"
        EXPIRED = "expired"
        VOID = "void"

    class Decision(models.TextChoices):
        ACCEPT = "accept"
        EDIT = "edit"
        REJECT = "reject"

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    run = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, related_name="input_requests", db_index=False
    )
    key = models.CharField(max_length=300)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.QUESTION)
    question = models.TextField()
    choices = models.JSONField(default=list, blank=True)
    # The model's tool call this answers (a question), for the conversation.
    call_id = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    requested_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    answered_at = models.DateTimeField(null=True, blank=True)
    answered_by = models.CharField(max_length=200, blank=True)
    # api | console | comment
    answered_via = models.CharField(max_length=16, blank=True)
    answer = models.TextField(blank=True)
    decision = models.CharField(max_length=16, choices=Decision.choices, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "key"], name="inputrequest_unique_key"),
        ]
        indexes = [
            # The expiry sweep's scan: pending questions by deadline.
            models.Index(
                fields=["expires_at"],
                condition=Q(status="pending"),
                name="inputrequest_pending_expiry",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind}: {self.question[:60]}"
