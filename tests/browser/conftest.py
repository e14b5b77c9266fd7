"""Headless Debian Chromium driven by Playwright against the app as ``make serve`` runs it.

``served`` starts ``manage.py serve`` (uvicorn + a Celery worker + beat) in its own
process group on a free port, with the production settings module pointed at the test
database, after the ``collectstatic`` that ``make setup`` runs: pages, static files and
the API docs come from the same server a user gets, not from pytest's live server.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps as django_apps
from django.conf import settings
from django.core.management.base import CommandError
from django.db import OperationalError
from django.test import TransactionTestCase

from runs.management.process_groups import process_groups_stop
from tests.conftest import OUTPUT_DIR, ROOT

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
SCREENSHOTS = OUTPUT_DIR / "browser"


def _chromium_missing() -> str | None:
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        return f"Chromium not found at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = _chromium_missing()
    if missing is None:
        return
    here = Path(__file__).parent
    # Under REQUIRE_SERVICES=1 the session never gets here: tests/conftest.py stops it at
    # its start with one line naming the missing program (an error raised here, inside
    # an xdist worker, would end as the controller's INTERNALERROR instead).
    skip = pytest.mark.skip(reason=missing)
    for item in items:
        if Path(str(item.fspath)).parent == here:
            item.add_marker(skip)


# Browser tests commit their data (the server is another process) and each ends with a
# flush. Content types stay out of it: the long-lived server caches their ids, which a
# flush and re-creation would change under it.
SERVED_DB = pytest.mark.django_db(
    transaction=True,
    available_apps=[
        config.name
        for config in django_apps.get_app_configs()
        if config.name != "django.contrib.contenttypes"
    ],
)


FLUSH_TRIES = 5


@pytest.fixture(autouse=True, scope="module")
def flush_retried_on_deadlock() -> Iterator[None]:
    """The served stack (other processes) keeps working while a test's data is flushed:
    a transaction of its that writes two tables and the flush's TRUNCATE of every table
    can each hold a lock the other waits for, and PostgreSQL then cancels one of them,
    sometimes the flush. The flush is tried again, as the stack retries its own."""
    original = TransactionTestCase._fixture_teardown

    def retried(self: TransactionTestCase) -> None:
        for attempt in range(1, FLUSH_TRIES + 1):
            try:
                original(self)
                return
            except (CommandError, OperationalError) as exc:
                if attempt == FLUSH_TRIES or "deadlock detected" not in str(exc.__cause__ or exc):
                    raise
                time.sleep(0.2 * attempt)

    TransactionTestCase._fixture_teardown = retried
    yield
    TransactionTestCase._fixture_teardown = original


@dataclass
class Served:
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serve_env() -> dict[str, str]:
    db = settings.DATABASES["default"]
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "agentplatform.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "AGENTPLATFORM_VAR_DIR": str(settings.VAR_DIR),
        "SANDBOX_ROOT": str(settings.SANDBOX_ROOT),
        # Plain http on 127.0.0.1: cookies marked Secure would never come back.
        "SESSION_COOKIE_SECURE": "0",
        "CSRF_COOKIE_SECURE": "0",
    }


@pytest.fixture(scope="module")
def served(django_db_setup: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``make serve`` (after ``make setup``'s collectstatic) on a free port.

    One stack per module: its worker would take other tests' messages from the shared
    test broker, and its beat would hold the leader lock other tests' beats wait for.
    """
    env = _serve_env()
    manage = [sys.executable, "manage.py"]
    subprocess.run(
        [*manage, "collectstatic", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True
    )
    port = _free_port()
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [*manage, "serve", "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Served(url=f"http://127.0.0.1:{port}", log_path=log_path)
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"serve exited: {server.log()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{server.url}/healthz", timeout=2) as answer:  # noqa: S310
                    # Every worker of the host's layout (agent, verify, events) says it.
                    if answer.status == 200 and log_path.read_bytes().count(b" ready.") >= 3:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"serve not ready: {server.log()[-3000:]}")
            time.sleep(0.2)
        yield server
    finally:
        # SIGTERM to serve itself: it stops web, worker and beat in order.
        process_groups_stop([process], timeout=30)


@pytest.fixture(scope="module")
def browser(django_db_setup: Any) -> Iterator[Any]:
    """One Chromium per module: Playwright's sync API keeps an asyncio loop running in
    this thread while it lives, so it must be gone before other modules' tests run."""
    from playwright.sync_api import sync_playwright

    # With that loop running, Django refuses ORM calls from this thread; the calls the
    # tests make are plain synchronous ones, so the check is relaxed while it runs.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield chromium
            chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()


def screenshot(page: Any, name: str) -> Path:
    """Save a full-page screenshot under test-output/browser/."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    target = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(target), full_page=True)
    return target
