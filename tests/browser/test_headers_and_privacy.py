"""The dashboard under its strict Content-Security-Policy (its own scripts and styles only,
never framed): every page renders with no violation, and the policy is enforced, not only
sent. A job's page shows its environment's values to its owner only."""

from __future__ import annotations

import contextlib
import urllib.error
from typing import Any

import pytest

from tests.browser.conftest import DESKTOP, Dashboard, Stack, _open
from tests.browser.test_dashboard import PAGES, _expect_text

pytestmark = pytest.mark.browser

# Each page's violations, as the browser reports them to the page.
WATCH_CSP = """
window.__csp = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.__csp.push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`));
"""
SECRET = "AKIA-browser-secret-7f3a"


def _violations(page: Any) -> list[str]:
    found: list[str] = page.evaluate("window.__csp")
    return found


def _csp_messages(dash: Dashboard) -> list[str]:
    return [e for e in dash.console.errors if "Content Security Policy" in e]


def test_every_page_renders_under_the_csp_without_a_violation(
    dash: Dashboard, stack: Stack
) -> None:
    page = dash.page
    page.add_init_script(WATCH_CSP)
    response = page.goto(stack.url + "/")
    headers = response.all_headers()
    policy = headers["content-security-policy"]
    for rule in ("default-src 'self'", "script-src 'self'", "style-src 'self'",
                 "frame-ancestors 'none'", "object-src 'none'"):  # fmt: skip
        assert rule in policy, policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer"
    page.wait_for_selector("#token")
    dash.login(stack.admin_token)
    job = stack.request(
        "POST",
        "/api/v1/jobs",
        {"name": "csp-job", "command": "echo hello; sleep 30", "env": {"LR": "0.1"}},
    )
    try:
        for _name, route, ready in [*PAGES, ("job", f"#/jobs/{job['id']}", "#job-command")]:
            dash.go(route)
            page.wait_for_selector(ready)
            page.wait_for_load_state("networkidle")
            assert _violations(page) == [], route
        _expect_text(page, "#job-log", "hello", timeout=20_000)
        assert _violations(page) == [] and _csp_messages(dash) == []
        dash.assert_clean()

        # Enforced: a script injected into the page (as an XSS would) does not run.
        ran = page.evaluate(
            """() => {
                const s = document.createElement("script");
                s.textContent = "window.__injected = true";
                document.body.append(s);
                return window.__injected === true;
            }"""
        )
        assert ran is False
        assert any(v.startswith("script-src") for v in _violations(page)), _violations(page)
    finally:
        with contextlib.suppress(urllib.error.HTTPError):
            stack.request("POST", f"/api/v1/jobs/{job['id']}/cancel")


def test_the_api_docs_and_every_answer_carry_the_headers(stack: Stack) -> None:
    import urllib.request

    for path in ("/js/app.js", "/css/app.css", "/healthz", "/docs"):
        with urllib.request.urlopen(stack.url + path, timeout=10) as resp:
            assert resp.headers["X-Content-Type-Options"] == "nosniff", path
            assert "frame-ancestors 'none'" in resp.headers["Content-Security-Policy"], path


def test_a_jobs_page_shows_its_environment_to_its_owner_only(
    dash: Dashboard, browser: Any, stack: Stack
) -> None:
    """bob's colleague in project cv sees the variables' names, not their values."""
    fiona = stack.request("POST", "/api/v1/users", {"name": "fiona", "projects": ["cv"]})
    job = stack.request(
        "POST",
        "/api/v1/jobs",
        {"command": ["true"], "env": {"AWS_SECRET_ACCESS_KEY": SECRET}, "hold": True},
        token=stack.bob_token,
    )
    colleague = _open(browser, stack, DESKTOP)
    other = next(colleague)
    try:
        for view, token, shown in ((dash, stack.bob_token, SECRET), (other, fiona["token"], "…")):
            view.login(token)
            view.go(f"#/jobs/{job['id']}")
            _expect_text(view.page, "main", f"AWS_SECRET_ACCESS_KEY={shown}")
            view.assert_clean()
        assert SECRET not in other.page.content()
    finally:
        colleague.close()
        with contextlib.suppress(urllib.error.HTTPError):
            stack.request("POST", f"/api/v1/jobs/{job['id']}/cancel")
