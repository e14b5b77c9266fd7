"""An on-call engineer works the console in a real browser (headless Chromium)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.contrib.auth.models import Group
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from agentplatform.api.notify import run_events_announce
from jobs.models import DeadLetter
from runs.models import Run
from tests.browser.conftest import SERVED_DB, screenshot
from tests.factories import DeadLetterFactory, UserFactory
from tests.runs.test_admin_run_page import run_history_create

pytestmark = SERVED_DB

PASSWORD = "correct horse battery staple"


@pytest.fixture
def broker_queues() -> Iterator[None]:
    """Leave no message behind in this run's broker database."""
    yield
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    for name in ("agent", "verify", "events", "webhooks"):
        client.delete(name)


@pytest.fixture
def logged_in(page: Any, served: Any, broker_queues: None) -> Any:
    """A staff operator (not a superuser) logged in through the admin login form."""
    user = UserFactory(username="oncall", is_staff=True)
    # The server runs the production settings and their hasher, not the tests' fast one.
    user.password = PBKDF2PasswordHasher().encode(PASSWORD, PBKDF2PasswordHasher().salt())
    user.save()
    user.groups.add(Group.objects.get_or_create(name="operators")[0])
    page.goto(f"{served.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "oncall")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#ops-dashboard-link")
    return page


def test_operator_logs_in_and_opens_the_dashboard(logged_in: Any, served: Any) -> None:
    DeadLetterFactory()
    page = logged_in

    page.click("#ops-dashboard-link")

    page.wait_for_selector("#chart-runs-per-hour")
    assert page.title().startswith("Operations dashboard")
    dead = page.locator('[data-metric="open-dead-letters"]')
    assert dead.locator(".value").inner_text() == "1"
    assert "bad" in (dead.get_attribute("class") or "")
    # The served stack's own worker and beat use the broker too: a depth, not an exact one.
    assert page.locator('[data-metric="queue-agent"] .value').inner_text().isdigit()
    # Styled: the admin's served stylesheet paints the header, the console's the card.
    header = page.locator("#header").evaluate("e => getComputedStyle(e).backgroundColor")
    assert header not in ("rgba(0, 0, 0, 0)", "transparent")
    assert dead.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(255, 235, 238)"
    # It follows the activity stream: when a run moves, the page re-reads itself in place.
    page.evaluate("window.__sameDocument = true")

    def announced_until_shown(count: str) -> None:
        shown = "document.querySelector('[data-metric=\"open-dead-letters\"] .value')"
        shown += f".innerText === '{count}'"
        for _ in range(25):
            # Announced again until seen: the page's stream may not be subscribed yet.
            run_events_announce(run_id=uuid.uuid4(), sequence=1)
            try:
                page.wait_for_function(shown, timeout=1_000)
                return
            except PlaywrightTimeoutError:
                continue

    def settled(quiet_ms: int = 5_000) -> None:
        # An announcement repeated above may still be on its way, or its re-read under
        # way: wait until the page has not re-read itself for a while.
        updated = "document.querySelector('[data-live-stream]').dataset.liveUpdated"
        for _ in range(20):
            before = page.evaluate(updated)
            page.wait_for_timeout(quiet_ms)
            if page.evaluate(updated) == before:
                return
        raise AssertionError("the page kept re-reading itself with nothing announced")

    DeadLetterFactory()
    announced_until_shown("2")
    assert dead.locator(".value").inner_text() == "2"
    settled()
    # Now that the page follows the stream: nothing announced, nothing re-read (it
    # follows events, it does not poll).
    DeadLetterFactory()
    page.wait_for_timeout(11_000)
    assert dead.locator(".value").inner_text() == "2"
    announced_until_shown("3")
    assert dead.locator(".value").inner_text() == "3"
    assert page.evaluate("window.__sameDocument") is True
    screenshot(page, "dashboard")


def test_operator_opens_a_run_and_reads_its_timeline(logged_in: Any, served: Any) -> None:
    run = run_history_create(pr=True)
    page = logged_in

    page.goto(f"{served.url}/admin/runs/run/?q={run.task.repository.name}")
    page.click(f"text={run.short_id}")

    page.wait_for_selector("#timeline")
    phases = page.locator("#timeline .console-phase h3").all_inner_texts()
    assert [p.lower() for p in phases] == [
        "setup",
        "planning",
        "editing",
        "verification",
        "judging",
        "approval",
    ]
    types = page.locator("#timeline .console-event-type").all_inner_texts()
    assert types[0] == "agent.run.queued" and "agent.patch.created" in types
    assert page.locator("#patches .console-diff .add").first.inner_text().startswith("+")
    assert "Fix add()" in page.locator("#pull-request").inner_text()
    screenshot(page, "run-timeline")


def test_operator_cancels_a_run(logged_in: Any, served: Any) -> None:
    run = run_history_create()
    page = logged_in
    page.goto(f"{served.url}/admin/runs/run/{run.pk}/change/")

    page.fill("#run-actions input[name=comment]", "wrong repository")
    page.click("#action-cancel")

    page.wait_for_selector("ul.messagelist")
    assert "Cancel: 1 row(s) changed." in page.locator("ul.messagelist").inner_text()
    assert page.locator("#timeline").get_by_text("agent.run.operator_action").count() == 1
    run.refresh_from_db()
    assert (run.cancel_requested_by, run.cancel_reason) == ("oncall", "wrong repository")
    screenshot(page, "run-cancelled")


def test_operator_requeues_a_dead_letter(logged_in: Any, served: Any) -> None:
    letter = DeadLetterFactory(task_name="runs.tasks_readmit", queue="events")
    page = logged_in
    page.goto(f"{served.url}/admin/jobs/deadletter/?status__exact=open")

    page.check(f"input[name=_selected_action][value='{letter.pk}']")
    page.select_option("select[name=action]", "requeue")
    page.click("button[name=index]")

    page.wait_for_selector("ul.messagelist")
    assert re.search(r"Requeue: 1 row\(s\) changed", page.locator("ul.messagelist").inner_text())
    letter.refresh_from_db()
    assert (letter.status, letter.resolved_by) == (DeadLetter.Status.REQUEUED, "oncall")
    screenshot(page, "dead-letter-requeued")
    assert Run.objects.count() == 0


def test_runs_list_fits_the_screen_with_coloured_statuses(logged_in: Any, served: Any) -> None:
    long_instruction = "Migrate every LegacyClock.now() call to TimeProvider.now() " * 6
    runs = [run_history_create() for _ in range(3)]
    for run in runs:
        run.task.instruction = long_instruction
        run.task.save(update_fields=["instruction"])
    Run.objects.filter(pk=runs[0].pk).update(status=Run.Status.FAILED, failure_reason="step_error")
    page = logged_in

    page.goto(f"{served.url}/admin/runs/run/")
    page.wait_for_selector("#result_list")

    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 1400, f"the runs list is {width}px wide in a 1400px window"
    # Every row is one line high: no title broken one word per line.
    heights = page.eval_on_selector_all(
        "#result_list tbody tr", "rows => rows.map(r => r.getBoundingClientRect().height)"
    )
    assert heights and max(heights) < 40, heights
    failed = page.locator("#result_list .console-badge", has_text="failed").first
    colour = failed.evaluate("el => getComputedStyle(el).backgroundColor")
    assert colour == "rgb(198, 40, 40)", colour
    # Nothing is hidden behind a horizontal scroll: the last columns are on screen.
    for column in ("cost", "failure_reason"):
        right = page.eval_on_selector(
            f"#result_list td.field-{column}", "el => el.getBoundingClientRect().right"
        )
        assert right <= 1400, f"{column} ends at {right}px"
    overflow = page.eval_on_selector(
        "#changelist .results", "el => [el.scrollWidth, el.clientWidth]"
    )
    screenshot(page, "runs-list-1400px")
    assert overflow[0] <= overflow[1], overflow
    screenshot(page, "runs-list-1400px")

    page.fill("#searchbar", f"{runs[1].short_id} #{runs[1].run_no}")
    page.press("#searchbar", "Enter")
    page.wait_for_selector("#result_list")
    shown = page.locator("#result_list tbody tr").all_inner_texts()
    assert len(shown) == 1 and runs[1].short_id in shown[0]
    screenshot(page, "runs-search-short-id")


def test_a_dead_letter_page_links_its_run_and_requeues(logged_in: Any, served: Any) -> None:
    run = run_history_create()
    letter = DeadLetterFactory(task_name="runs.step", args=[str(run.id), 4], queue="agent")
    page = logged_in

    page.goto(f"{served.url}/admin/jobs/deadletter/{letter.pk}/change/")
    page.wait_for_selector("#dead-letter-actions")
    assert "Django administration" not in page.content()
    assert page.locator("#dead-letter-carries a").first.inner_text() == str(run)
    assert page.locator(".deletelink").count() == 0
    screenshot(page, "dead-letter-page")

    page.click("#action-requeue")
    page.wait_for_selector("ul.messagelist")
    assert "Requeue: 1 row(s) changed." in page.locator("ul.messagelist").inner_text()
    letter.refresh_from_db()
    assert letter.status == DeadLetter.Status.REQUEUED
    page.click("#dead-letter-carries a")
    page.wait_for_selector("#run-summary")
    assert page.locator("h1").first.inner_text() == f"Run {run.short_id} #{run.run_no}"
    screenshot(page, "dead-letter-run")
