"""The agent fences its jobs by installation + node + job + attempt, attributes GPU
processes to jobs by that fence, and runs each job as its owner's Unix account.

Real agents (Agent objects, as the Celery worker drives them), real processes, real
accounts (tests/unix_accounts.py)."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from app.wire import Finished
from tests.agent.support import RecordingReporter, installation_of, run, stop
from tests.agent.test_agent_fence import alive, first_line
from tests.support.wait import WAIT_S, wait_until
from tests.unix_accounts import delete_account, make_account
from workers.agent.fence import GpuDevice
from workers.agent.gpu_backend import GpuProcess, GpuSample, GpuStatic, NodeInfo, NodeSample
from workers.agent.service import Agent, AgentSettings


class FakeGpus:
    """One GPU whose processes are whatever the test says (NVML's list)."""

    def __init__(self) -> None:
        self.processes: tuple[GpuProcess, ...] = ()

    def node_info(self) -> NodeInfo:
        return NodeInfo("host", "test", (GpuStatic(0, "GPU-0", "H100", 81559, device_minor=0),))

    def sample(self) -> NodeSample:
        gpu = GpuSample(
            0, "GPU-0", True, None, 90.0, 10.0, 2000, 79559, 40.0, 300.0, self.processes
        )
        return NodeSample(time.time(), (gpu,))

    def close(self) -> None:
        pass


def make_agent(
    tmp_path: Path, installation: str, reporter: RecordingReporter, **settings: Any
) -> Agent:
    settings.setdefault("uid0_accounts", "root")
    return Agent(
        settings=AgentSettings(name="n1", grace_s=1.0, installation=installation, **settings),
        backend=FakeGpus(),  # type: ignore[arg-type]
        reporter=reporter,
        log_dir=tmp_path / installation / "logs",
        log_cap_bytes=10_000,
        state_dir=tmp_path / installation / "state",
        gpu_devices=(),
    )


def start(
    agent: Agent, job_id: int, command: str | list[str], unix_user: str = "root", **extra: Any
) -> str:
    if isinstance(command, list):
        command = tuple(command)
    fields = {"job_id": job_id, "attempt": 1, "command": command, "unix_user": unix_user}
    return run(agent, **{**fields, **extra})


def finished(reporter: RecordingReporter, job_id: int) -> Finished | None:
    return next((r for r in reporter.of(Finished) if r.job_id == job_id), None)


# -- installations ------------------------------------------------------------------------


def test_two_installations_with_one_node_name_never_touch_each_others_jobs(
    tmp_path: Path,
) -> None:
    mine, theirs = installation_of(tmp_path / "a"), installation_of(tmp_path / "b")
    a_reports, b_reports, b2_reports = RecordingReporter(), RecordingReporter(), RecordingReporter()
    a = make_agent(tmp_path, mine, a_reports)
    a.start()
    b = make_agent(tmp_path, theirs, b_reports)
    b2 = make_agent(tmp_path, theirs, b2_reports)
    try:
        # Job 1, attempt 1 on node n1 in both installations: equal names everywhere.
        assert start(a, 1, f"echo $$ > {tmp_path}/a; sleep 60") == "started"
        assert start(b, 1, f"echo $$ > {tmp_path}/b; sleep 60") == "started"
        a_pid, b_pid = int(first_line(tmp_path / "a")), int(first_line(tmp_path / "b"))
        # Installation b's agent restarts (b crashed, its job left over): it ends b's
        # leftover and reports it lost, and never sees a's.
        b2.start()
        assert wait_until(lambda: not alive(b_pid))
        lost = finished(b2_reports, 1)
        assert lost is not None and lost.result == "LOST"
        assert alive(a_pid) and a.running_count() == 1
        # a's agent dies: its watchdog ends a's job, and nothing of b's.
        assert start(b2, 2, f"echo $$ > {tmp_path}/b2; sleep 60") == "started"
        b2_pid = int(first_line(tmp_path / "b2"))
        assert a._watchdog is not None and a._watchdog.stdin is not None
        a._watchdog.stdin.close()
        assert a._watchdog.wait(WAIT_S) == 0
        assert wait_until(lambda: not alive(a_pid))
        assert alive(b2_pid) and b2.running_count() == 1
    finally:
        for agent in (a, b, b2):
            for key in list(agent._running):
                stop(agent, job_id=key[0], attempt=key[1], grace_s=0)
            assert wait_until(lambda agent=agent: agent.running_count() == 0)
        b2.stop()


# -- GPU processes are the job's by its fence (issue 39) ------------------------------------


def test_torchrun_workers_in_new_sessions_are_attributed_to_their_job(tmp_path: Path) -> None:
    reports = RecordingReporter()
    agent = make_agent(tmp_path, installation_of(tmp_path), reports)
    workers_file = tmp_path / "workers"
    torchrun = (
        f'{sys.executable} -c "import subprocess; '
        "ws = [subprocess.Popen(['sleep', '60'], start_new_session=True) for _ in range(2)]; "
        f"open('{workers_file}', 'w').write(' '.join(str(w.pid) for w in ws)); "
        '[w.wait() for w in ws]"'
    )
    foreign = subprocess.Popen(["sleep", "60"])
    try:
        assert start(agent, 7, torchrun, gpu_indices=[0]) == "started"
        assert wait_until(workers_file.exists)
        workers = [int(p) for p in workers_file.read_text().split()]
        assert wait_until(
            lambda: first_line(workers_file) and all(os.getpgid(w) == w for w in workers)
        )
        backend = agent.backend
        assert isinstance(backend, FakeGpus)
        backend.processes = (
            *(GpuProcess(pid, 30_000) for pid in workers),
            GpuProcess(foreign.pid, 1_000),
        )
        [gpu] = agent.heartbeat(backend.sample()).gpus
        owners = {p.pid: p.job_id for p in gpu.processes}
        assert owners == {workers[0]: 7, workers[1]: 7, foreign.pid: None}
        assert gpu.foreign_memory_mb == 1_000  # the workers' 60 GB are the job's own
        assert gpu.foreign_util_pct == pytest.approx(90.0 * 1_000 / 61_000)
    finally:
        foreign.kill()
        foreign.wait()
        stop(agent, job_id=7, attempt=1, grace_s=0)
        assert wait_until(lambda: agent.running_count() == 0)


# -- accounts -----------------------------------------------------------------------------


def test_a_job_runs_as_its_owners_account_with_its_files_private(
    tmp_path: Path, unix_accounts: dict
) -> None:
    alice = unix_accounts["alice"]
    reports = RecordingReporter()
    agent = make_agent(tmp_path, installation_of(tmp_path), reports)
    assert agent.jobs_run_as is None  # root: each job as its owner
    report = 'echo "$(id -un) $(id -u) $HOME $(umask)"; ls -ld "$0"'
    script = f"#!/bin/sh\n{report}\n"
    assert start(agent, 3, ["train.sh"], alice.name, script=script, workdir="/") == "started"
    assert wait_until(lambda: finished(reports, 3))
    done = finished(reports, 3)
    assert done is not None and done.result == "SUCCEEDED", done
    log = tmp_path / agent.settings.installation / "logs" / "3" / "attempt-1.log"
    who, uid, home, umask, *listing = log.read_text().split()
    assert (who, int(uid), home, umask) == (alice.name, alice.uid, alice.home, "0077")
    assert listing[0] == "-rwx------" and listing[2] == alice.name  # its script copy: hers
    info = log.stat()
    assert (info.st_uid, info.st_mode & 0o777) == (alice.uid, 0o600)  # its log: hers alone
    assert done.cpu_s is not None and done.memory_peak_mb is not None


def test_an_account_the_node_lacks_refuses_the_run_until_it_exists(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only a root agent runs jobs as their owners (useradd needs root too)")
    name = f"gpusched-t-dave-{uuid.uuid4().hex[:6]}"
    reports = RecordingReporter()
    agent = make_agent(tmp_path, installation_of(tmp_path), reports)
    try:
        assert start(agent, 4, "true", name) == "refused"
        refused = finished(reports, 4)
        assert refused is not None
        assert (refused.result, refused.account) == ("REFUSED", name)
        assert refused.account_reason == "no such account on this node"
        assert f"no usable unix account {name!r} on node n1" in refused.message
        beat = agent.heartbeat(NodeSample(time.time(), ()))
        assert beat.unusable_accounts == {name: "no such account on this node"}
        make_account(name)
        assert agent.heartbeat(NodeSample(time.time(), ())).unusable_accounts == {}
        assert start(agent, 4, "id -un", name, attempt=2) == "started"
        assert wait_until(lambda: len(reports.of(Finished)) == 2)
        assert reports.of(Finished)[-1].result == "SUCCEEDED"
    finally:
        if name in {p.pw_name for p in pwd.getpwall()}:
            delete_account(name)


def test_uid_0_only_when_the_settings_name_the_account(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only a root agent runs jobs as their owners")
    reports = RecordingReporter()
    strict = make_agent(tmp_path, installation_of(tmp_path), reports, uid0_accounts="")
    assert start(strict, 5, "true", "root") == "refused"
    refused = finished(reports, 5)
    assert refused is not None and "uid 0" in refused.account_reason
    lenient = make_agent(tmp_path, installation_of(tmp_path / "x"), RecordingReporter())
    assert start(lenient, 5, "true", "root") == "started"
    assert wait_until(lambda: lenient.running_count() == 0)


def test_single_user_runs_every_job_as_one_account(tmp_path: Path, unix_accounts: dict) -> None:
    carol = unix_accounts["carol"]
    reports = RecordingReporter()
    agent = make_agent(tmp_path, installation_of(tmp_path), reports, run_as_user=carol.name)
    assert agent.jobs_run_as == carol.name
    assert start(agent, 6, "id -un", "someone-else", workdir="/") == "started"
    assert wait_until(lambda: finished(reports, 6))
    log = tmp_path / agent.settings.installation / "logs" / "6" / "attempt-1.log"
    assert log.read_text().strip() == carol.name


def test_a_job_may_open_only_its_own_gpus_device_files(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, installation_of(tmp_path), RecordingReporter())
    devices = tuple(GpuDevice(f"/dev/nvidia{m}", 195, m) for m in (0, 1))
    agent.gpu_devices = devices
    assert agent.denied_devices((0,)) == (devices[1],)
    assert agent.denied_devices(()) == devices  # a CPU job: no GPU at all
