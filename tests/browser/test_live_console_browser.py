"""The console lives: a run page follows its run without reloads, the patch is approved
where its diff is shown, and the workers page shows the server's own worker."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.contrib.auth.models import Group

from runs import demo
from runs.models import Membership, Run, Task
from runs.services import task_submit
from tests.browser.conftest import SERVED_DB, screenshot
from tests.factories import UserFactory

pytestmark = SERVED_DB

PASSWORD = "correct horse battery staple"
RUN_TIMEOUT_MS = 120_000


@pytest.fixture
def approver(page: Any, served: Any, workspace: Any) -> Any:
    """A staff operator who is an approver of the workspace, logged in."""
    user = UserFactory(username="vera", is_staff=True)
    user.password = PBKDF2PasswordHasher().encode(PASSWORD, PBKDF2PasswordHasher().salt())
    user.save()
    user.groups.add(Group.objects.get_or_create(name="operators")[0])
    Membership.objects.create(workspace=workspace, user=user, role=Membership.Role.APPROVER)
    page.goto(f"{served.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "vera")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#ops-dashboard-link")
    return page


def test_run_page_follows_the_run_and_approves_next_to_the_diff(
    approver: Any, served: Any, workspace: Any, repository: Any
) -> None:
    page = approver
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        requested_by="ric",
        execution_mode=Task.Mode.SUPERVISED_PR,
        model_options={"provider": "scripted", "script": demo.fix_script()},
    )
    page.goto(f"{served.url}/admin/runs/run/{submission.run.pk}/change/")
    # Anything that survives until the end proves the page never reloaded.
    page.evaluate("window.__sameDocument = true")

    # The approval panel appears by itself once the run waits, with the diff above
    # the buttons that approve it.
    page.wait_for_selector("#approval #action-approve", timeout=RUN_TIMEOUT_MS)
    assert page.evaluate("window.__sameDocument") is True
    assert page.locator("#approval-diff .add").count() >= 1
    # Measured in one pass in the page: the live view may re-render the panel between
    # two separate reads, and an element being replaced has no box.
    page.wait_for_function(
        """() => {
            const diff = document.querySelector('#approval-diff');
            const button = document.querySelector('#action-approve');
            if (!diff || !button) return false;
            const gap = button.getBoundingClientRect().top - diff.getBoundingClientRect().bottom;
            return diff.getBoundingClientRect().height > 0 && 0 <= gap && gap < 400;
        }""",
        timeout=RUN_TIMEOUT_MS,
    )
    # One render reads the timeline before the approval panel; a step committing in
    # between shows the panel first, and the event's frame re-renders the timeline.
    page.wait_for_function(
        """() => [...document.querySelectorAll('#timeline .console-event-type')]
            .some(cell => cell.textContent.trim() === 'agent.approval.requested')""",
        timeout=RUN_TIMEOUT_MS,
    )
    assert page.evaluate("window.__sameDocument") is True
    screenshot(page, "run-awaiting-approval")

    page.fill("#approval input[name=comment]", "looks right")
    page.click("#action-approve")
    page.wait_for_selector("ul.messagelist")
    assert "Approve: 1 row(s) changed." in page.locator("ul.messagelist").inner_text()
    page.evaluate("window.__sameDocument = true")
    # On a quick machine the run may already be over when the page comes back.
    over_at_load = page.locator("#run-summary .console-badge").inner_text() == "completed"

    page.wait_for_selector("#pull-request", timeout=RUN_TIMEOUT_MS)
    page.wait_for_function(
        "document.querySelector('#run-summary .console-badge').innerText === 'completed'",
        timeout=RUN_TIMEOUT_MS,
    )
    assert page.evaluate("window.__sameDocument") is True
    # Set only by the live script when it re-renders the page in place.
    if not over_at_load:
        assert page.locator("#run-console[data-live-updated]").count() == 1
    assert page.locator("#approval").count() == 0
    run = Run.objects.get(pk=submission.run.pk)
    assert run.status == Run.Status.COMPLETED
    approved = run.events.get(type="agent.approval.approved")
    assert (approved.actor, approved.data["comment"]) == ("vera", "looks right")
    screenshot(page, "run-completed-live")


def test_workers_page_shows_the_served_worker(approver: Any, served: Any) -> None:
    page = approver
    page.click("#ops-dashboard-link")
    page.click("#ops-workers-link")

    rows = page.locator(".worker-row[data-alive=true]")
    rows.first.wait_for()
    # The host's layout: agent, verify and delivery workers; the "events" worker also
    # serves the relay's own queue (agentplatform.celery).
    expected = {"agent", "events", "relay", "verify", "webhooks"}
    deadline = time.monotonic() + 20
    while True:  # each worker's first heartbeat row may come a moment after the others
        served_queues = {
            queue
            for text in rows.locator(".worker-queues").all_inner_texts()
            for queue in text.split(", ")
        }
        if served_queues == expected or time.monotonic() > deadline:
            break
        time.sleep(1)
        page.reload()
        rows.first.wait_for()
    assert served_queues == expected
    row = rows.first
    # Styled by the served admin stylesheet and the console's own styles.
    badge = row.locator(".console-badge")
    assert badge.inner_text() == "alive"
    assert badge.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(46, 125, 50)"
    screenshot(page, "workers")
