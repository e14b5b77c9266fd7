"""Headless Debian Chromium driven by Playwright against pytest-django's live server."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import OUTPUT_DIR

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
    if os.environ.get("REQUIRE_SERVICES") == "1":
        raise pytest.UsageError(f"{missing}, and REQUIRE_SERVICES=1 makes that an error")
    skip = pytest.mark.skip(reason=missing)
    for item in items:
        if Path(str(item.fspath)).parent == here:
            item.add_marker(skip)


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
