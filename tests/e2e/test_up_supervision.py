"""`gpusched up` supervises like a supervisor (systemd's StartLimitBurst within
StartLimitIntervalSec): a process that exits is restarted, one that exits too often
within the window stops the stack, which says why and exits 1; its private Redis is
watched and restarted like the others. Real processes, killed with SIGKILL as the OOM
killer would."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_up_shutdown import _parent_of, _processes_of, _Up
from tests.support.servers import free_port
from tests.up_process import start_up

pytestmark = pytest.mark.e2e

# Long enough that the kills and restarts below fit in it on a loaded machine; that exits
# older than the window are forgotten is tested with a clock of its own
# (tests/cli/test_crash_budget.py).
WINDOW_S = 300
BURST = 2


@contextlib.contextmanager
def _up(data_dir: Path, *args: str) -> Iterator[_Up]:
    port = free_port()
    proc, _, log = start_up(data_dir, port=port, gpus="sim:1x1:H100-80GB", args=args)
    try:
        up = _Up(proc, log, f"http://127.0.0.1:{port}", {})
        up.until("ready", lambda: httpx.get(f"{up.url}/readyz").status_code == 200)
        token_file = data_dir / "admin.token"
        up.until("the admin token", token_file.exists)
        up.headers["Authorization"] = f"Bearer {token_file.read_text().strip()}"
        yield up
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in _processes_of(data_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _child(up: _Up, marker: str, *, not_pid: int | None = None) -> int:
    """The pid of `up`'s own child whose command line has `marker` (a new one, if
    `not_pid` is the one it replaces), once it runs."""

    def found() -> int | None:
        for pid, cmdline in _processes_of(up.log.parent).items():
            with contextlib.suppress(OSError, IndexError):
                if marker in cmdline and pid != not_pid and _parent_of(pid) == up.proc.pid:
                    return pid
        return None

    pid: int = up.until(f"a {marker!r} child of up", found)
    return pid


def _kill(up: _Up, marker: str) -> int:
    """SIGKILL `up`'s child with `marker`; returns the one `up` starts in its place."""
    pid = _child(up, marker)
    os.kill(pid, signal.SIGKILL)
    return _child(up, marker, not_pid=pid)


def _exit_code(up: _Up, data_dir: Path, *, timeout: float) -> int:
    """`up`'s exit code; if it has not exited in time, what it still waits for."""
    try:
        return up.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        alive = {}
        for pid, cmdline in _processes_of(data_dir).items():
            with contextlib.suppress(OSError):  # gone meanwhile
                alive[pid] = (cmdline, _parent_of(pid))
        raise AssertionError(
            f"up still running after {timeout:g}s; its processes still there "
            f"(pid: command line, parent): {alive}\n{up.log.read_text()[-3000:]}"
        ) from None


def test_a_process_that_keeps_exiting_stops_the_stack_saying_why(tmp_path: Path) -> None:
    args = ("--max-restarts", str(BURST), "--restart-window", str(WINDOW_S))
    with _up(tmp_path, *args) as up:
        for _ in range(BURST):  # within the budget: restarted each time
            _kill(up, "--only cycle")
        assert up.proc.poll() is None, up.log.read_text()[-3000:]
        # One more within the window: the stack stops, and says why.
        os.kill(_child(up, "--only cycle"), signal.SIGKILL)
        assert _exit_code(up, tmp_path, timeout=180) == 1
        log = up.log.read_text()
        assert log.count("scheduler exited with code -9; restarting") == BURST
        last = log.strip().splitlines()[-1]
        assert last == (
            f"gpusched stopped: scheduler exited {BURST + 1} times within {WINDOW_S}s (last "
            f"exit code -9; --max-restarts {BURST}); its output is above"
        ), log[-3000:]
        left = {p: c for p, c in _processes_of(tmp_path).items() if "app.cli" in c}
        assert left == {}, f"still running after the stack stopped: {left}"


def test_the_private_redis_is_restarted_on_its_port(tmp_path: Path) -> None:
    with _up(tmp_path) as up:
        first = _child(up, "valkey-server")
        os.kill(first, signal.SIGKILL)
        second = _child(up, "valkey-server", not_pid=first)
        assert "the private Redis exited with code -9; restarting" in up.log.read_text()
        # On its port: the API, the scheduler and the agent find it again, and run a job.
        up.until("ready again", lambda: httpx.get(f"{up.url}/readyz").status_code == 200)
        job = httpx.post(
            f"{up.url}/api/v1/jobs",
            json={"command": "true", "gpus": 1},
            headers=up.headers,
            timeout=30,  # not httpx's 5 s: a loaded machine
        ).json()

        def succeeded() -> bool:
            r = httpx.get(f"{up.url}/api/v1/jobs/{job['id']}", headers=up.headers)
            return r.json()["status"] == "SUCCEEDED"

        up.until("a job run after the restart", succeeded)
        # Ctrl-C: the stack stops and says so; the restarted Redis goes with it.
        up.proc.send_signal(signal.SIGINT)
        assert up.proc.wait(timeout=120) == 0
        assert up.log.read_text().strip().splitlines()[-1] == "gpusched stopped: Ctrl-C"
        assert not Path(f"/proc/{second}").exists() or _zombie(second)


def _zombie(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    return True
