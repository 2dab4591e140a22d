"""Browser tests: the real stack (`gpusched up` with simulated GPUs) driven by headless
Chromium through Playwright's sync API.

Needs Debian's chromium at /usr/bin/chromium and the `playwright` Python package (never
`playwright install`: the browser comes from apt). Without them every test here is skipped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import free_port
from tests.support.wait import poll
from tests.up_process import start_up

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("GPUSCHED_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = REPO / "artifacts" / "screenshots"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}

try:
    from playwright.sync_api import sync_playwright

    HAVE_PLAYWRIGHT = True
except ImportError:  # pragma: no cover - depends on the machine
    HAVE_PLAYWRIGHT = False


def _skip_reason() -> str | None:
    # The browser suite starts its own stack on SQLite (`gpusched up`): it touches no test
    # database, so `make test` runs it once, in the SQLite pass.
    if not HAVE_PLAYWRIGHT:
        return "the playwright Python package is not installed (pip install playwright)"
    if not Path(CHROMIUM).exists():
        return f"no browser: install Debian's Chromium (apt-get install -y chromium) for {CHROMIUM}"
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "browser: drives the dashboard in headless Chromium")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _skip_reason()
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.browser)
            # One worker runs them all: one stack (`up`) for the suite, not one per worker.
            item.add_marker(pytest.mark.xdist_group("gpusched-up"))
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


# ---------------------------------------------------------------- the stack


@dataclass
class Stack:
    url: str
    data_dir: Path
    env: dict[str, str]
    admin_token: str
    bob_token: str = ""
    log: Path = field(default_factory=Path)

    @property
    def sim_state(self) -> Path:
        return self.data_dir / "sim-state.json"

    def request(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {token or self.admin_token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None


def _get(url: str, token: str | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=3) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
        return 0, None


def _wait(what: str, check: Any, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> Any:
    def probe() -> Any:
        if proc.poll() is not None:
            raise RuntimeError(
                f"gpusched up exited ({proc.returncode}):\n{log.read_text()[-4000:]}"
            )
        return check()

    return poll(
        what, probe, timeout=timeout, interval=0.25, on_timeout=lambda: log.read_text()[-4000:]
    )


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if _skip_reason():
        pytest.skip(_skip_reason() or "")
    data_dir = tmp_path_factory.mktemp("gpusched-browser")
    port = free_port()
    proc, env, log = start_up(
        data_dir,
        port=port,
        gpus="sim:2x4:H100-80GB",
        # Agents re-read this file each sample: tests write foreign processes / failures into it.
        env={
            "GPUSCHED_AGENT_SIM_STATE_FILE": str(data_dir / "sim-state.json"),
            # Webhooks to this machine only (a test's receiver).
            "GPUSCHED_NOTIFY_HOSTS": "127.0.0.1",
        },
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait("/readyz", lambda: _get(url + "/readyz")[0] == 200, proc, log, 60)
        token_file = data_dir / "admin.token"
        _wait("the admin token", token_file.exists, proc, log, 10)
        token = token_file.read_text().strip()

        def nodes_sampled() -> bool:
            status, nodes = _get(url + "/api/v1/nodes", token)
            return (
                status == 200
                and len(nodes) == 2
                and all(n["state"] == "READY" for n in nodes)
                and all(g["sampled_at"] for n in nodes for g in n["gpus"])
            )

        _wait("2 nodes with sampled GPUs", nodes_sampled, proc, log, 60)
        bob = subprocess.run(
            [sys.executable, "-m", "app.cli", "admin", "create-user", "bob", "--project", "cv"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        stack = Stack(url=url, data_dir=data_dir, env=env, admin_token=token, log=log)
        stack.bob_token = bob.stdout.strip().splitlines()[-1]
        yield stack
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def gate() -> Iterator[Path]:
    """A file a job waits for (`while [ ! -e GATE ]`), created by the test when the job
    may go on; in a folder any job's account can look into."""
    folder = Path(tempfile.mkdtemp(prefix="gpusched-gate-"))
    folder.chmod(0o755)
    try:
        yield folder / "open"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------- the browser


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if _skip_reason():
        pytest.skip(_skip_reason() or "")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


# Chromium logs every non-2xx fetch as a console error ("Failed to load resource"). These
# are the answers the dashboard expects and handles: endpoints that may not exist yet
# (404) and the ones a test provokes on purpose (422 from the form, 401 for a bad token).
EXPECTED_HTTP = [
    (404, re.compile(r"/api/v1/(windows/upcoming|batches|me)\b|/api/v1/jobs/\d+/telemetry")),
    # A job page asks for a waiting job's rank; the job may be placed a moment before.
    (409, re.compile(r"/api/v1/jobs/\d+/rank$")),
]


@dataclass
class Console:
    errors: list[str] = field(default_factory=list)
    allowed: list[tuple[int, re.Pattern[str]]] = field(default_factory=lambda: list(EXPECTED_HTTP))

    def allow(self, status: int, pattern: str) -> None:
        self.allowed.append((status, re.compile(pattern)))

    def on_console(self, msg: Any) -> None:
        if msg.type != "error":
            return
        text = msg.text
        url = (msg.location or {}).get("url", "")
        found = re.search(r"status of (\d{3})", text)
        if found and any(int(found.group(1)) == s and p.search(url) for s, p in self.allowed):
            return
        self.errors.append(f"{text} ({url})")

    def on_page_error(self, exc: Any) -> None:
        self.errors.append(f"uncaught: {exc}")


@dataclass
class Dashboard:
    """A browser page on the dashboard, with its console watched."""

    page: Any
    console: Console
    url: str

    def login(self, token: str) -> None:
        self.page.goto(self.url + "/#/")
        self.page.fill("#token", token)
        self.page.click("button[type=submit]")
        self.page.wait_for_selector("#topbar:not([hidden])")

    def go(self, route: str) -> None:
        self.page.evaluate("route => { window.location.hash = route }", route)

    def shot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        # A full-page shot of a scrolled page would paint the sticky header mid-page.
        self.page.evaluate("window.scrollTo(0, 0)")
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def assert_clean(self) -> None:
        assert not self.console.errors, "console errors:\n" + "\n".join(self.console.errors)


def _open(
    browser: Any, stack: Stack, viewport: dict[str, int], **options: Any
) -> Iterator[Dashboard]:
    context = browser.new_context(viewport=viewport, device_scale_factor=1, **options)
    context.set_default_timeout(15_000)
    page = context.new_page()
    console = Console()
    page.on("console", console.on_console)
    page.on("pageerror", console.on_page_error)
    yield Dashboard(page=page, console=console, url=stack.url)
    context.close()


@pytest.fixture
def dash(browser: Any, stack: Stack) -> Iterator[Dashboard]:
    yield from _open(browser, stack, DESKTOP)


@pytest.fixture
def phone(browser: Any, stack: Stack) -> Iterator[Dashboard]:
    yield from _open(browser, stack, PHONE)


@pytest.fixture
def berlin(browser: Any, stack: Stack) -> Iterator[Dashboard]:
    """A browser in Berlin (CET in winter, CEST in summer), whatever the machine's zone."""
    yield from _open(browser, stack, DESKTOP, timezone_id="Europe/Berlin", locale="en-US")
