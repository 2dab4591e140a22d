"""/docs and /redoc on a machine without internet: every file they load is the app's own,
and Swagger UI draws the operations (with its Authorize button) while every request to
another origin is refused."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest

from app.config import Settings
from app.db import make_engine, make_session_factory
from app.main import create_app
from tests.browser.conftest import SCREENSHOTS
from tests.cli.conftest import serve_in_thread

DOC_PAGES = ("/docs", "/redoc")


@pytest.fixture(scope="module")
def api_url() -> Iterator[str]:
    """The app alone (no scheduler, no data): the docs need only its OpenAPI document."""
    factory = make_session_factory(make_engine("sqlite://"))
    app = create_app(Settings(database_url="sqlite://"), session_factory=factory)
    url, server, thread, sock = serve_in_thread(app)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


class _Assets(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href") and value:
                self.urls.append(value)


def _get(url: str) -> tuple[int, bytes, str]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.read(), resp.headers.get("content-type", "")


@pytest.mark.parametrize("page", DOC_PAGES)
def test_doc_pages_may_load_nothing_from_another_origin(api_url: str, page: str) -> None:
    with urllib.request.urlopen(api_url + page, timeout=10) as resp:
        policy = resp.headers["content-security-policy"]
    rules = dict(rule.strip().split(" ", 1) for rule in policy.split(";"))
    assert rules["default-src"] == "'self'"
    for name in ("script-src", "style-src", "img-src", "connect-src", "font-src"):
        sources = rules[name].split()
        assert set(sources) <= {"'self'", "'unsafe-inline'", "data:"}, (name, sources)


@pytest.mark.parametrize("page", DOC_PAGES)
def test_doc_pages_load_only_same_origin_assets_each_served(api_url: str, page: str) -> None:
    status, body, _ = _get(api_url + page)
    assert status == 200
    html = body.decode()
    parser = _Assets()
    parser.feed(html)
    # The OpenAPI document is named in the page's script, not in an attribute.
    urls = [*parser.urls, *re.findall(r"""(?:url|spec-url)[=:]\s*['"]([^'"]+)['"]""", html)]
    assert any(u.endswith(".js") for u in urls), urls
    assert "/openapi.json" in urls, urls
    for url in urls:
        absolute = urljoin(api_url + page, url)
        assert urlsplit(absolute).netloc == urlsplit(api_url).netloc, url
        assert _get(absolute)[0] == 200, url
    assert "http://" not in html.replace(api_url, "") and "https://" not in html


def _offline_page(browser: Any, api_url: str) -> tuple[Any, Any, list[str], list[str]]:
    """A page whose requests to any other origin are aborted (and recorded)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    origin = urlsplit(api_url).netloc
    elsewhere: list[str] = []
    problems: list[str] = []

    def route(r: Any) -> None:
        url = r.request.url
        if urlsplit(url).scheme in ("http", "https") and urlsplit(url).netloc != origin:
            elsewhere.append(url)
            r.abort()
        else:
            r.continue_()

    context.route("**/*", route)
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    return context, page, elsewhere, problems


def test_swagger_ui_renders_the_operations_offline(browser: Any, api_url: str) -> None:
    context, page, elsewhere, problems = _offline_page(browser, api_url)
    try:
        page.goto(api_url + "/docs")
        page.wait_for_selector(".opblock-summary", timeout=30_000)
        operations = page.locator(".opblock-summary-path").all_inner_texts()
        assert "/api/v1/jobs/{job_id}" in [op.replace("\u200b", "") for op in operations]
        assert len(operations) > 40
        # The bearer scheme: the Authorize button, and a lock on the operations needing it.
        assert page.locator("button.authorize").count() == 1
        assert page.locator(".opblock .authorization__btn").count() > 40
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "api-docs.png"))
        # An operation's own errors, each with the problem details shape.
        hold = page.locator("#operations-jobs-hold_job_api_v1_jobs__job_id__hold_post")
        hold.locator(".opblock-summary").click()
        codes = hold.locator(".responses-table .response-col_status").all_inner_texts()
        assert {c.split()[0] for c in codes} >= {"401", "403", "404", "409", "422", "429"}
        assert "application/problem+json" in hold.inner_text()
        hold.locator(".responses-table").screenshot(path=str(SCREENSHOTS / "api-docs-hold.png"))
        assert elsewhere == []
        assert problems == []
    finally:
        context.close()


def test_redoc_renders_offline(browser: Any, api_url: str) -> None:
    context, page, elsewhere, problems = _offline_page(browser, api_url)
    try:
        page.goto(api_url + "/redoc")
        page.get_by_text("Queue a job.", exact=False).first.wait_for(timeout=30_000)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "api-redoc.png"))
        assert elsewhere == []
        # ReDoc's footer names its logo on Redocly's CDN: the policy stops it before any
        # request (the footer keeps its text). Nothing else may be refused or fail.
        assert [p for p in problems if "cdn.redoc.ly/redoc/logo-mini.svg" not in p] == []
    finally:
        context.close()
