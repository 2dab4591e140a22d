"""`gpusched up` as root and as a plain user both start and run a job, and say whose
account jobs run as: as root, each job runs as its owner's Unix account; as a plain user
(single-user), every job runs as that user, which `up`, `gpusched nodes` and the nodes API
all say."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_up_shutdown import _processes_of
from tests.support.servers import free_port
from tests.up_process import REPO, start_up

pytestmark = pytest.mark.e2e
GPUS = "sim:1x1:H100-80GB"
SYSTEM_PYTHON = Path("/usr/bin/python3")


class _Up:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path, data_dir: Path, port: int):
        self.proc, self.log, self.data_dir = proc, log, data_dir
        self.url = f"http://127.0.0.1:{port}"
        self.headers: dict[str, str] = {}

    def until(self, what: str, check: Any, timeout: float = 120) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"up exited:\n{self.log.read_text()[-4000:]}"
            with contextlib.suppress(httpx.HTTPError, OSError):
                if result := check():
                    return result
            time.sleep(0.25)
        raise TimeoutError(f"{what}:\n{self.log.read_text()[-4000:]}")

    def ready(self) -> None:
        self.until("ready", lambda: httpx.get(f"{self.url}/readyz").status_code == 200)
        token = self.data_dir / "admin.token"
        self.until("the admin token", token.exists)
        self.headers = {"Authorization": f"Bearer {token.read_text().strip()}"}
        self.until("its node", lambda: self.get("/api/v1/nodes"))

    def get(self, path: str, headers: dict[str, str] | None = None) -> Any:
        r = httpx.get(f"{self.url}{path}", headers=headers or self.headers, timeout=30)
        r.raise_for_status()
        return r.json()

    def run(self, command: str, headers: dict[str, str] | None = None) -> str:
        """Run a job to its end; its output."""
        r = httpx.post(f"{self.url}/api/v1/jobs", json={"command": command, "gpus": 1},
                       headers=headers or self.headers, timeout=30)  # fmt: skip
        assert r.status_code == 201, r.text
        job = r.json()["id"]
        done = self.until(
            f"job {job} to end",
            lambda: (
                (j := self.get(f"/api/v1/jobs/{job}"))["status"]
                in ("SUCCEEDED", "FAILED", "CANCELLED")
                and j
            ),
        )
        assert done["status"] == "SUCCEEDED", done
        logs = httpx.get(f"{self.url}/api/v1/jobs/{job}/logs", headers=self.headers, timeout=30)
        return logs.text

    def nodes_cli(self, env: dict[str, str]) -> str:
        token = self.headers["Authorization"].split()[1]
        result = subprocess.run(
            [sys.executable, "-m", "app.cli", "nodes", "--url", self.url, "--token", token],
            env={**env, "COLUMNS": "250"}, cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return " ".join(result.stdout.split())

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGINT)  # Ctrl-C
        try:
            self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pid in _processes_of(self.data_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def _up_as_root(data_dir: Path) -> Iterator[tuple[_Up, dict[str, str]]]:
    port = free_port()
    proc, env, log = start_up(data_dir, port=port, gpus=GPUS)
    up = _Up(proc, log, data_dir, port)
    try:
        up.ready()
        yield up, env
    finally:
        up.stop()


def test_up_as_root_runs_each_job_as_its_owners_account(
    tmp_path: Path, unix_accounts: dict
) -> None:
    alice = unix_accounts["alice"]
    with _up_as_root(tmp_path) as (up, env):
        assert "jobs run as their owners' Unix accounts" in up.log.read_text()
        made = subprocess.run(
            [sys.executable, "-m", "app.cli", "admin", "create-user", "al", "-p", "ml",
             "--unix-user", alice.name],
            env=env, cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        hers = {"Authorization": f"Bearer {made.stdout.strip()}"}
        assert up.run("id -un; id -u", hers).split() == [alice.name, str(alice.uid)]
        # The admin's account is root's (the tests run as root): a stack root started runs
        # its admin's jobs as root, with no setting (the README's `make run` as root).
        assert "admin's: root" in up.log.read_text()
        assert up.run("id -u").split() == ["0"]
        [node] = up.get("/api/v1/nodes")
        assert node["isolation"] in ("cgroup v1", "cgroup v2"), node
        assert node["jobs_run_as"] is None
        listed = up.nodes_cli(env)
        assert node["isolation"] in listed and "each its owner's" in listed, listed


def test_up_as_a_plain_user_runs_every_job_as_that_user(unix_accounts: dict) -> None:
    carol = unix_accounts["carol"]
    version = subprocess.run([str(SYSTEM_PYTHON), "-c", "import sys; print(sys.version_info[:2])"],
                             capture_output=True, text=True)  # fmt: skip
    if version.stdout.strip() != str(sys.version_info[:2]):
        pytest.skip(f"no system Python {sys.version_info[:2]} a plain user may run")
    data_dir = Path(carol.home) / f"up-{uuid.uuid4().hex[:6]}"
    subprocess.run(["runuser", "-u", carol.name, "--", "mkdir", "-m", "700", str(data_dir)],
                   check=True)  # fmt: skip
    port = free_port()
    # The virtual environment's interpreter lives in root's home: she runs the system's,
    # with the environment's packages. Below 3.11.3 the valkey client imports
    # async_timeout, which is asyncio's own timeout since 3.11.
    shim = Path(carol.home) / f"{data_dir.name}-shim"
    shim.mkdir()
    (shim / "async_timeout.py").write_text("from asyncio import timeout\n")
    site = f"{sysconfig.get_paths()['purelib']}:{shim}"
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": carol.home,
        "PYTHONPATH": f"{REPO}:{site}",
        "PYTHONUNBUFFERED": "1",
        "GPUSCHED_NATIVE": "0",  # the compiled core was built for this interpreter, not that
        "GPUSCHED_DATA_DIR": str(data_dir),
        "GPUSCHED_PORT": str(port),
        # Free ports, as start_up gives: the defaults (9101, 9102) collided with another
        # test's stack in a parallel worker, and up refused to start.
        "GPUSCHED_SCHEDULER_METRICS_PORT": str(free_port()),
        "GPUSCHED_SCHEDULER_REPORTS_METRICS_PORT": str(free_port()),
    }
    log = Path(carol.home) / f"{data_dir.name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["runuser", "-u", carol.name, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()),
             str(SYSTEM_PYTHON), "-m", "app.cli", "up", "--gpus", GPUS],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    up = _Up(proc, log, data_dir, port)
    try:
        up.ready()
        assert f"single-user: jobs run as {carol.name}" in log.read_text()
        assert up.run("id -un").split() == [carol.name]
        [node] = up.get("/api/v1/nodes")
        assert node["jobs_run_as"] == carol.name
        assert node["isolation"] in ("subreaper only", "cgroup v2")  # no v1 cgroup is hers
        listed = up.nodes_cli({"PATH": env["PATH"], "HOME": "/root"})
        assert f"single-user: jobs run as {carol.name}" in listed, listed
    finally:
        up.stop()
