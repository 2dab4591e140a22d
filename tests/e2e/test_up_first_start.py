"""`gpusched up`'s console on a first start (issue 36 point 3): the processes log warnings
only, so the dashboard URL, the admin token and where the CLI's copy is saved are the
last lines and stay there while jobs run; -v brings Celery's lines back. The CLI then
works from any directory, with neither a token nor a URL given (point 4)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_up_shutdown import _processes_of, _Up
from tests.support.servers import free_port
from tests.up_process import REPO, start_up

# `up`'s default node names are those of the browser suite's stack (test_up_shutdown).
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("gpusched-up")]

LAST_LINE = "Press Ctrl-C to stop."


@contextlib.contextmanager
def _up(data_dir: Path, *args: str) -> Iterator[_Up]:
    port = free_port()
    data_dir.mkdir()
    proc, _, log = start_up(data_dir, port=port, gpus="sim:1x1:H100-80GB", args=args)
    try:
        up = _Up(proc, log, f"http://127.0.0.1:{port}", {})
        up.until("the start announced", lambda: LAST_LINE in log.read_text())
        token = (data_dir / "admin.token").read_text().strip()
        up.headers["Authorization"] = f"Bearer {token}"
        yield up
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in _processes_of(data_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _run_a_job(up: _Up) -> None:
    """A job through the whole stack: cycles, the agent, its reports all did their work."""
    job = up.submit("true")
    url = f"{up.url}/api/v1/jobs/{job['id']}"
    up.until(
        "the job done",
        lambda: httpx.get(url, headers=up.headers).json()["status"] == "SUCCEEDED",
    )


def test_the_url_and_token_are_printed_last_and_stay_last(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with _up(data_dir) as up:
        _run_a_job(up)
        text = up.log.read_text()
        listed = _cli_from_elsewhere(tmp_path / "elsewhere", data_dir / "xdg-config", "jobs")
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines[-1] == LAST_LINE, text[-3000:]
    banner = "\n".join(lines[-14:])
    token = (data_dir / "admin.token").read_text().strip()
    assert token in banner and str(data_dir / "admin.token") in banner
    assert f"dashboard: {up.url}/   API docs: {up.url}/docs" in banner
    config = data_dir / "xdg-config" / "gpusched"
    assert f"CLI: URL and token saved in {config}/ (mode 0600)" in banner
    # No Celery banner, task lines or root warning: the processes log warnings only.
    for chatter in ("[tasks]", "celery@", " INFO ", "superuser privileges", "received"):
        assert chatter not in text, (chatter, text[-3000:])
    # The CLI found the server and the token from another directory, given neither.
    assert listed.returncode == 0, listed.stderr
    assert '"status": "SUCCEEDED"' in listed.stdout


def _cli_from_elsewhere(folder: Path, config_home: Path, *args: str) -> Any:
    folder.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCHED_")}
    env.update(XDG_CONFIG_HOME=str(config_home), PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args, "--json"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_verbose_brings_the_processes_lines_back(tmp_path: Path) -> None:
    with _up(tmp_path / "data", "-v") as up:
        up.until(
            "beat's cycles in the log",
            lambda: "Task gpusched.schedule_cycle[" in up.log.read_text(),
        )
        text = up.log.read_text()
    assert "[tasks]" in text and " INFO " in text
