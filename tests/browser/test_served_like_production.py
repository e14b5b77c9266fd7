"""A new user's first look, served by ``make serve``: styled pages and offline API docs."""

from __future__ import annotations

import urllib.request
from typing import Any
from urllib.parse import urlparse

from tests.browser.conftest import SERVED_DB, screenshot

pytestmark = SERVED_DB


def _offline(page: Any, served: Any) -> list[str]:
    """Refuse every request that leaves the server; return what was refused."""
    refused: list[str] = []
    own = urlparse(served.url).netloc

    def route(route: Any) -> None:
        if urlparse(route.request.url).netloc == own:
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    page.route("**/*", route)
    return refused


def test_login_page_is_styled_by_the_served_stylesheets(page: Any, served: Any) -> None:
    refused = _offline(page, served)
    failed: list[str] = []
    page.on("response", lambda r: failed.append(r.url) if r.status >= 400 else None)

    page.goto(f"{served.url}/admin/login/")

    # Django admin's base.css paints the header; unstyled, it is transparent.
    header = page.locator("#header")
    assert header.evaluate("e => getComputedStyle(e).backgroundColor") not in (
        "rgba(0, 0, 0, 0)",
        "transparent",
    )
    stylesheet = page.locator("link[rel=stylesheet]").first.get_attribute("href") or ""
    # collectstatic's hashed names, served by the web process itself with a long cache.
    assert stylesheet.startswith("/static/admin/css/") and stylesheet.count(".") >= 2
    with urllib.request.urlopen(f"{served.url}{stylesheet}") as answer:  # noqa: S310
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/css")
        assert "max-age=315360000" in answer.headers["Cache-Control"]
    assert failed == [] and refused == []
    screenshot(page, "login-styled")


def test_swagger_ui_renders_offline(page: Any, served: Any) -> None:
    refused = _offline(page, served)

    page.goto(f"{served.url}/api/docs/")

    page.wait_for_selector(".swagger-ui .info .title")
    assert "agentplatform API" in page.locator(".swagger-ui .info .title").inner_text()
    assert page.locator(".opblock").count() > 10
    assert refused == []
    screenshot(page, "api-docs-swagger")


def test_redoc_renders_offline(page: Any, served: Any) -> None:
    refused = _offline(page, served)

    page.goto(f"{served.url}/api/docs/redoc/")

    page.wait_for_selector("h1:has-text('agentplatform API')")
    assert page.locator("[data-section-id]").count() > 10
    # Redoc's own footer badge links its maker's logo and hides it when unreachable.
    assert [url for url in refused if not url.endswith("/redoc/logo-mini.svg")] == []
    screenshot(page, "api-docs-redoc")
