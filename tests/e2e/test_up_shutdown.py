"""Ctrl-C on `gpusched up` (the README's first command): running jobs get SIGTERM and
go back to the queue, and nothing is left running. The stack stops the cycle before the
agents, so a job the stop requeues is not placed again on another node meanwhile (it was,
and that agent, already stopped, started it: an orphan process and a job lost to it)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, select

from app.jobs.models import Job, JobEvent
from tests.support.servers import free_port
from tests.support.wait import poll
from tests.up_process import start_up

# `up`'s default node names (sim-1, ...) are those of the browser suite's stack: in one
# worker with it, so that no agent's leftover sweep meets the other stack's jobs.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("gpusched-up")]

# The job's command, told apart from any other stack's jobs (the browser suite's `up`
# names its nodes sim-1 and sim-2 too).
COMMAND = "sleep 3171"


def _processes_running(command: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes().replace(b"\0", b" ").strip() == command.encode():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue  # it ended meanwhile
    return found


def _until(what: str, check: Callable[[], Any], proc: subprocess.Popen[bytes], log: Path) -> Any:
    def probe() -> Any:
        assert proc.poll() is None, f"gpusched up exited:\n{log.read_text()[-4000:]}"
        return check()

    return poll(what, probe, timeout=90, interval=0.25, on_timeout=lambda: log.read_text()[-4000:])


@dataclass
class _Up:
    proc: subprocess.Popen[bytes]
    log: Path
    url: str
    headers: dict[str, str]

    def until(self, what: str, check: Callable[[], Any]) -> Any:
        return _until(what, check, self.proc, self.log)

    def submit(self, command: str) -> dict[str, Any]:
        body = {"command": command, "gpus": 1}
        job: dict[str, Any] = httpx.post(
            f"{self.url}/api/v1/jobs",
            json=body,
            headers=self.headers,
            timeout=30,  # not httpx's 5 s: a loaded machine
        ).json()
        return job


@contextlib.contextmanager
def _running_up(data_dir: Path, gpus: str, *commands: str) -> Iterator[_Up]:
    """`gpusched up` ready, with its admin's headers. At the end, whatever is left of it
    (its private Redis, when it was killed) and of jobs running `commands` is killed."""
    port = free_port()
    proc, _, log = start_up(data_dir, port=port, gpus=gpus)
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
        left = [*_processes_of(data_dir), *(p for c in commands for p in _processes_running(c))]
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# A terminal's Ctrl-C signals the whole foreground process group: `up` and whatever it
# started in its group. The private Redis once was in it, died first, and the agents'
# reports of the jobs they stopped were lost (the job stayed RUNNING).
@pytest.mark.parametrize("to_group", [False, True], ids=["to-up", "to-its-process-group"])
def test_ctrl_c_requeues_running_jobs_and_leaves_nothing_running(
    tmp_path: Path, to_group: bool
) -> None:
    # Two nodes of one GPU: the job runs on one, the other is free to take it again.
    with _running_up(tmp_path, "sim:2x1:H100-80GB", COMMAND) as up:
        job = up.submit(COMMAND)

        def running() -> bool:
            r = httpx.get(f"{up.url}/api/v1/jobs/{job['id']}", headers=up.headers)
            return r.json()["status"] == "RUNNING"

        up.until("the job running", running)
        if to_group:
            os.killpg(up.proc.pid, signal.SIGINT)
        else:
            up.proc.send_signal(signal.SIGINT)
        up.proc.wait(timeout=90)
        assert "gpusched stopped" in up.log.read_text()
        # Gone, not only signalled: a process the agent's stop killed may still be exiting.
        poll(
            "the job's processes gone",
            lambda: not _processes_running(COMMAND),
            timeout=30,
            on_timeout=lambda: _describe(_processes_running(COMMAND)),
        )

    engine = create_engine(f"sqlite:///{tmp_path / 'gpusched.db'}")
    with engine.connect() as db:
        status, attempt = db.execute(
            select(Job.status, Job.attempt).where(Job.id == job["id"])
        ).one()
        steps = db.execute(
            select(JobEvent.attempt, JobEvent.to_status)
            .where(JobEvent.job_id == job["id"])
            .order_by(JobEvent.id)
        ).all()
    engine.dispose()
    # Placed and started once, stopped by the shutdown and back in the queue; not placed
    # again while the stack stopped.
    assert (status, attempt) == ("PENDING", 1), steps
    assert [tuple(s) for s in steps] == [
        (0, "PENDING"),
        (1, "SCHEDULED"),
        (1, "RUNNING"),
        (1, "PREEMPTED"),
        (1, "PENDING"),
    ]


def _describe(pids: list[int]) -> str:
    """What is known of processes left running: state, parent and cgroups (which fence
    they escaped, if any)."""
    lines = []
    for pid in pids:
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            head = [line for line in status if line.startswith(("State:", "PPid:", "SigIgn:"))]
            cgroups = Path(f"/proc/{pid}/cgroup").read_text().split()
            lines.append(f"pid {pid}: {' '.join(head)}; cgroups {' '.join(cgroups)}")
    return "\n".join(lines)


def _processes_of(data_dir: Path) -> dict[int, str]:
    """pid -> command line of every process started for this data dir: by its environment,
    or its working directory (the private Redis runs in <data dir>/redis, with its own)."""
    wanted = f"GPUSCHED_DATA_DIR={data_dir}".encode()
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            ours = wanted in (proc / "environ").read_bytes().split(b"\0") or (
                proc / "cwd"
            ).resolve().is_relative_to(data_dir)
            if ours:
                found[int(proc.name)] = (
                    (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                )
        except OSError:
            continue  # it ended meanwhile, or is not ours to read
    return found


def test_killed_up_takes_its_service_and_jobs_with_it(tmp_path: Path) -> None:
    # `kill -9` of `up` (or the OOM killer): its children, in sessions of their own, must
    # not run on unsupervised, still taking jobs; each gets SIGTERM and stops as on Ctrl-C.
    command = "sleep 3172"
    with _running_up(tmp_path, "sim:1x1:H100-80GB", command) as up:
        job = up.submit(command)
        up.until("the job's process", lambda: _processes_running(command))
        children = {p: c for p, c in _processes_of(tmp_path).items() if "app.cli" in c}
        assert len(children) >= 4, children  # API, scheduler, reports, agent

        os.kill(up.proc.pid, signal.SIGKILL)
        up.proc.wait()

        def service_left() -> dict[int, str]:
            return {p: c for p, c in _processes_of(tmp_path).items() if "app.cli" in c}

        poll(
            "`up`'s processes to go with it",
            lambda: not service_left(),
            on_timeout=lambda: f"still running after `up` was killed: {service_left()}",
        )
        # Gone, not only signalled: the agent's stop may still be ending the job.
        poll(
            f"job {job['id']}'s processes gone",
            lambda: not _processes_running(command),
            timeout=30,
            on_timeout=lambda: _describe(_processes_running(command)),
        )


def _parent_of(pid: int) -> int:
    return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_killed_scheduler_takes_its_beat_with_it(tmp_path: Path) -> None:
    # Celery runs the embedded beat in a child of the scheduler's worker; killed outright
    # (the OOM killer), the worker must not leave it firing cycles beside its successor.
    with _running_up(tmp_path, "sim:1x1:H100-80GB") as up:

        def beat_and_worker() -> tuple[int, int] | None:
            cycle = [p for p, c in _processes_of(tmp_path).items() if "--only cycle" in c]
            pairs = [(p, _parent_of(p)) for p in cycle if _parent_of(p) in cycle]
            return pairs[0] if pairs else None

        beat, worker = up.until("the scheduler's beat", beat_and_worker)
        os.kill(worker, signal.SIGKILL)
        poll(
            f"beat {beat} to go with its worker {worker}",
            lambda: not Path(f"/proc/{beat}").exists(),
        )
        up.proc.send_signal(signal.SIGINT)
        up.proc.wait(timeout=90)
