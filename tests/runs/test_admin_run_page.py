"""The run page shows the whole story of a run: timeline by phase, turns, diff, verdicts."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from runs.admin.run_page import timeline_phases
from runs.models import (
    Approval,
    Artifact,
    JudgeAttempt,
    ModelTurn,
    Patch,
    PullRequest,
    Run,
    ToolCall,
    VerificationAttempt,
)
from runs.timeline import PendingEvent, events_record
from tests.factories import RunFactory, UserFactory

DIFF = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""

HISTORY: list[tuple[str, dict[str, Any]]] = [
    ("agent.run.queued", {"run_no": 1}),
    ("agent.run.started", {"attempt": 1}),
    ("agent.run.status.changed", {"from": "queued", "to": "preparing"}),
    ("agent.sandbox.created", {"base_commit": "abc123"}),
    ("agent.run.status.changed", {"from": "preparing", "to": "context_loading"}),
    ("agent.context.loaded", {"chars": 420}),
    ("agent.run.status.changed", {"from": "context_loading", "to": "planning"}),
    ("agent.model.turn.completed", {"purpose": "plan", "tokens_in": 900, "tokens_out": 120}),
    ("agent.plan.created", {"summary": "fix the sign in add()"}),
    ("agent.run.status.changed", {"from": "planning", "to": "running"}),
    ("agent.tool.call.requested", {"tool": "write_file"}),
    ("agent.tool.call.completed", {"tool": "write_file", "duration_ms": 3}),
    ("agent.patch.created", {"attempt_no": 1, "lines_added": 1, "lines_removed": 1}),
    ("agent.run.status.changed", {"from": "running", "to": "verifying"}),
    ("agent.verification.started", {"command": "python -m pytest -q"}),
    ("agent.verification.passed", {"exit_code": 0}),
    ("agent.run.status.changed", {"from": "verifying", "to": "judging"}),
    ("agent.judge.completed", {"verdict": "accept"}),
    ("agent.approval.requested", {"expires_in": 3600}),
    ("agent.run.status.changed", {"from": "judging", "to": "awaiting_approval"}),
]


def _artifact(run: Run, kind: str, name: str, content: str) -> Artifact:
    return Artifact.objects.create(
        run=run,
        kind=kind,
        name=name,
        content=content,
        size_bytes=len(content),
        sha256=hashlib.sha256(content.encode()).hexdigest(),
    )


def run_history_create(*, run: Run | None = None, pr: bool = False) -> Run:
    """A run awaiting approval with everything a run leaves behind, timeline included."""
    run = run or RunFactory()
    now = timezone.now()
    with transaction.atomic():
        events_record(task=run.task, run=run, events=[PendingEvent(t, d) for t, d in HISTORY])
        ModelTurn.objects.create(
            run=run,
            step_no=3,
            turn_no=1,
            purpose="plan",
            provider="scripted",
            model="script-1",
            tokens_in=900,
            tokens_out=120,
            cost_usd=Decimal("0.0021"),
            latency_ms=35,
        )
        ToolCall.objects.create(
            run=run,
            step_no=4,
            turn_no=1,
            call_id="c1",
            tool="write_file",
            arguments={"path": "calc.py"},
            status="completed",
            duration_ms=3,
        )
        patch = Patch.objects.create(
            run=run,
            attempt_no=1,
            diff_sha256=hashlib.sha256(DIFF.encode()).hexdigest(),
            diff_artifact=_artifact(run, "diff", "patch 1", DIFF),
            files_changed=["calc.py"],
            lines_added=1,
            lines_removed=1,
        )
        VerificationAttempt.objects.create(
            run=run,
            patch=patch,
            command="python -m pytest -q",
            outcome="passed",
            exit_code=0,
            duration_ms=812,
            summary="1 passed",
            log_artifact=_artifact(run, "log", "verify", "collected 1 item\n1 passed in 0.01s"),
        )
        JudgeAttempt.objects.create(
            run=run,
            patch=patch,
            verdict="accept",
            score=0.93,
            findings=[{"rule": "diff_size", "severity": "info", "message": "small diff"}],
        )
        Approval.objects.create(
            run=run,
            patch=patch,
            patch_sha256=patch.diff_sha256,
            expires_at=now + timedelta(hours=1),
        )
        if pr:
            PullRequest.objects.create(
                task=run.task,
                provider="local",
                branch="agent/fix-add",
                base_branch="main",
                number=7,
                url="http://git.example/pr/7",
                title="Fix add()",
            )
        Run.objects.filter(pk=run.pk).update(
            status=Run.Status.AWAITING_APPROVAL,
            status_changed_at=now,
            started_at=now,
            tokens_in=900,
            tokens_out=120,
            cost_usd=Decimal("0.0021"),
            checkpoint={"attempt_no": 1, "tool_failures": 0},
        )
    run.refresh_from_db()
    return run


@pytest.fixture
def admin_client_su(client: Any, db: Any) -> Any:
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    return client


def test_timeline_is_grouped_by_phase_in_sequence_order(db: Any) -> None:
    run = run_history_create()
    phases = timeline_phases(list(run.events.order_by("sequence_no")))

    assert [p.name for p in phases] == [
        "setup",
        "planning",
        "editing",
        "verification",
        "judging",
        "approval",
    ]
    sequence = [e.sequence_no for p in phases for e in p.events]
    assert sequence == sorted(sequence) == list(range(1, len(HISTORY) + 1))
    editing = next(p for p in phases if p.name == "editing")
    assert "agent.patch.created" in [e.type for e in editing.events]


def test_run_page_shows_turns_diff_verification_judge_approval_and_pr(
    admin_client_su: Any,
) -> None:
    run = run_history_create(pr=True)

    response = admin_client_su.get(reverse("admin:runs_run_change", args=[run.pk]))

    assert response.status_code == 200
    html = response.content.decode()
    for section in (
        "timeline",
        "model-turns",
        "tool-calls",
        "patches",
        "verifications",
        "judgements",
        "approvals",
        "budgets",
    ):
        assert f'id="{section}"' in html
    assert '<div class="add">+    return a + b</div>' in html
    assert '<div class="del">-    return a - b</div>' in html
    assert "1 passed in 0.01s" in html
    assert "small diff" in html
    assert "http://git.example/pr/7" in html
    assert "agent.verification.passed" in html
    assert "write_file" in html
    assert 'id="action-approve"' in html


def test_artifacts_are_links_served_as_inert_text(admin_client_su: Any) -> None:
    run = run_history_create()
    hostile = _artifact(run, "model_response", "reply.html", "<script>alert(1)</script>")
    url = reverse("admin:runs_run_artifact", args=[run.pk, hostile.pk])

    html = admin_client_su.get(reverse("admin:runs_run_change", args=[run.pk])).content.decode()
    served = admin_client_su.get(url)
    other_run = run_history_create()
    wrong = admin_client_su.get(reverse("admin:runs_run_artifact", args=[other_run.pk, hostile.pk]))

    assert f'href="{url}"' in html
    assert served.status_code == 200
    assert served["Content-Type"] == "text/plain; charset=utf-8"
    assert served["X-Content-Type-Options"] == "nosniff"
    assert served.content == b"<script>alert(1)</script>"
    assert wrong.status_code == 404
