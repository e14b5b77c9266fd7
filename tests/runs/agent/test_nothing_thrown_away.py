"""A model that fixes the bug and then goes round in circles: the fix is not thrown away.

Against a local Chat Completions server, the model makes the right fix and then
either re-reads the same file forever (a loop: nudged, then stopped) or keeps reading
new lines until turns or money run out. Either way the working copy's diff goes to
verification and the judge like a finished attempt, marked as submitted by the loop
or the budget on the timeline, on the patch and in the run's detail.
"""

from __future__ import annotations

import time
from typing import Any

import jsonschema
import pytest
from rest_framework.test import APIClient

from jobs.contracts import catalog_entry, event_schema
from runs.engine import run_drive_inline
from runs.models import Membership, ModelTurn, Run
from runs.services import task_submit
from tests.factories import UserFactory
from tests.runs.providers.test_provider_openai_chat import ChatCompletionsServer, completion

pytestmark = pytest.mark.django_db(transaction=True)

CONTRACTED = ["agent.loop.detected", "agent.run.autosubmitted", "agent.patch.created"]
FIX = {"path": "calc/core.py", "old": "return a - b", "new": "return a + b"}


@pytest.fixture(autouse=True)
def driven_inline(monkeypatch):
    monkeypatch.setattr("runs.dispatch.run_wake", lambda **kwargs: None)


def _acting_turn(body: dict[str, Any]) -> int:
    return sum(1 for m in body["messages"] if m["role"] == "assistant") - 1


def fixes_then_rereads(body: dict[str, Any], number: int) -> tuple[int, dict[str, str], bytes]:
    if not body.get("tools"):
        return 200, {}, completion("1. Fix add(). 2. Check it.")
    turn = _acting_turn(body)
    if turn == 0:
        return 200, {}, completion("", [{"id": "fix", "name": "replace_text", "arguments": FIX}])
    read = {"id": f"r{turn}", "name": "read_file", "arguments": {"path": "calc/core.py"}}
    return 200, {}, completion("Let me look again.", [read])


def fixes_then_wanders(body: dict[str, Any], number: int) -> tuple[int, dict[str, str], bytes]:
    if not body.get("tools"):
        return 200, {}, completion("1. Fix add(). 2. Read around.")
    turn = _acting_turn(body)
    if turn == 0:
        return 200, {}, completion("", [{"id": "fix", "name": "replace_text", "arguments": FIX}])
    # Always something new: a different window each time, so no loop to detect.
    window = {"path": "calc/core.py", "start_line": 1 + turn % 5, "end_line": 2 + turn}
    return 200, {}, completion("", [{"id": f"r{turn}", "name": "read_file", "arguments": window}])


@pytest.fixture
def api_and_repository(sample_repo):
    from tests.factories import RepositoryFactory, WorkspaceFactory

    workspace = WorkspaceFactory(max_active_runs=10)
    repository = RepositoryFactory(workspace=workspace, clone_url=str(sample_repo))
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role="member")
    api = APIClient()
    api.force_authenticate(user)
    return api, repository


def _drive(settings, respond, repository, budget):
    with ChatCompletionsServer(respond) as server:
        settings.MODEL_PROFILES = {
            **settings.MODEL_PROFILES,
            "circles": {"provider": "openai", "model": "gpt-4o", "base_url": server.base_url},
        }
        submission = task_submit(
            workspace=repository.workspace,
            repository=repository,
            instruction="Fix add()",
            model_options={"profile": "circles"},
            budget=budget,
            execution_mode="autonomous_pr",
        )
        return run_drive_inline(run_id=submission.run.id), server


def test_a_model_that_rereads_after_fixing_is_nudged_then_its_fix_is_submitted(
    settings, api_and_repository
):
    api, repository = api_and_repository

    run, server = _drive(settings, fixes_then_rereads, repository, {"model_turns": 40})

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    loop = list(run.events.filter(type="agent.loop.detected").order_by("sequence_no"))
    assert [e.data["action"] for e in loop] == ["nudge", "stop"]
    # Far fewer than the 40 turns the budget allowed.
    assert ModelTurn.objects.filter(run=run, purpose="act").count() <= 9
    nudged = [r for r in server.requests if "same call(s)" in str(r["messages"][-1]["content"])]
    assert nudged, "the model was never told it repeats itself"
    patch = run.patches.get()
    assert patch.submitted_by == "loop"
    assert run.verifications.get().outcome == "passed"
    created = run.events.get(type="agent.patch.created")
    assert created.data["submitted_by"] == "loop"
    assert run.events.filter(type="agent.run.autosubmitted", data__submitted_by="loop").exists()
    detail = api.get(f"/api/runs/{run.id}/").json()
    assert detail["submitted_by"] == "loop"
    for event in run.events.filter(type__in=CONTRACTED):
        jsonschema.validate(
            event.data, event_schema(catalog_entry(event.type))["properties"]["data"]
        )


@pytest.mark.parametrize(
    ("budget", "reason"),
    [({"model_turns": 7}, "budget_model_turns"), ({"cost_usd": 0.0002}, "budget_cost")],
)
def test_a_fix_left_in_the_working_copy_when_the_budget_runs_out_is_verified(
    settings, api_and_repository, budget, reason
):
    api, repository = api_and_repository

    run, _ = _drive(settings, fixes_then_wanders, repository, budget)

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    assert run.events.filter(type="agent.budget.exhausted", data__reason=reason).exists()
    assert run.patches.get().submitted_by == "budget"
    assert run.verifications.get().outcome == "passed"
    assert run.events.filter(type="agent.run.autosubmitted", data__reason=reason).exists()
    assert api.get(f"/api/runs/{run.id}/").json()["submitted_by"] == "budget"
    # No summary from the model: the pull request is named after the instruction.
    assert run.task.pull_requests.get().title == "agent: Fix add()"


def test_an_empty_working_copy_still_fails_on_the_budget(settings, api_and_repository):
    def only_reads(body: dict[str, Any], number: int) -> tuple[int, dict[str, str], bytes]:
        if not body.get("tools"):
            return 200, {}, completion("1. Read.")
        turn = _acting_turn(body)
        window = {"path": "calc/core.py", "start_line": 1 + turn % 5, "end_line": 2 + turn}
        call = {"id": f"r{turn}", "name": "read_file", "arguments": window}
        return 200, {}, completion("", [call])

    _, repository = api_and_repository
    run, _ = _drive(settings, only_reads, repository, {"model_turns": 5})

    assert (run.status, run.failure_reason) == (Run.Status.FAILED, "budget_model_turns")
    assert not run.patches.exists()


def test_a_fix_left_when_the_wall_clock_runs_out_is_verified(settings, api_and_repository):
    def slow_wanderer(body: dict[str, Any], number: int) -> tuple[int, dict[str, str], bytes]:
        if body.get("tools") and _acting_turn(body) > 0:
            time.sleep(0.4)
        return fixes_then_wanders(body, number)

    _, repository = api_and_repository
    run, _ = _drive(settings, slow_wanderer, repository, {"wall_clock_seconds": 4})

    assert run.status == Run.Status.COMPLETED, (run.failure_reason, run.failure_detail)
    exhausted = run.events.filter(type="agent.budget.exhausted", data__reason="budget_wall_clock")
    assert exhausted.exists()
    assert run.patches.get().submitted_by == "budget"
    assert run.verifications.get().outcome == "passed"
