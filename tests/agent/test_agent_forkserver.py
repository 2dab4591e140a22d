"""Supervisors forked by the node's fork server (workers/agent/forkserver.py)."""

from __future__ import annotations

import logging
import os
import re
import resource
import signal
from io import BytesIO
from pathlib import Path

import pytest

from tests.agent.support import installation_of
from tests.support.wait import WAIT_S, wait_until
from workers.agent import forkserver, supervisor
from workers.agent.fence import Fence, choose_fence, supervisor_identity
from workers.agent.runner import (
    JobLaunch,
    LaunchError,
    RunningProcess,
    _StatusPipe,
    start_job,
    stop_groups,
)

NODE = "n1"


@pytest.fixture
def fence(tmp_path: Path) -> Fence:
    return choose_fence(installation_of(tmp_path), NODE)


def start(
    fence: Fence, tmp_path: Path, command: str, job_id: int, attempt: int = 1
) -> RunningProcess:
    return start_job(
        JobLaunch(
            command=command,
            workdir=tmp_path,
            job_id=job_id,
            attempt=attempt,
            log_path=tmp_path / f"{job_id}-{attempt}.log",
            grace_s=0.0,
        ),
        fence=fence,
    )


def parent_of(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    return int(raw[raw.rfind(b")") + 2 :].split()[1])


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def test_each_supervisor_is_forked_by_the_nodes_fork_server_and_named_as_its_attempt(
    fence: Fence, tmp_path: Path
) -> None:
    first = start(fence, tmp_path, "sleep 60", job_id=5, attempt=1)
    second = start(fence, tmp_path, "sleep 60", job_id=6, attempt=2)
    try:
        supervisors = [parent_of(running.pid) for running in (first, second)]
        server = parent_of(supervisors[0])
        assert parent_of(supervisors[1]) == server != os.getpid()
        assert supervisor.FORKSERVER in cmdline(server) and parent_of(server) == os.getpid()
        # Named as a supervisor started afresh would be, so the watchdog and a restarted
        # agent find them (and their jobs) by their command lines.
        assert [supervisor_identity(pid) for pid in supervisors] == [
            (fence.installation, NODE, 5, 1),
            (fence.installation, NODE, 6, 2),
        ]
        assert supervisor_identity(server) is None
        assert {group.key.job_id for group in fence.find()} == {5, 6}
    finally:
        stop_groups([(group, 0.0) for group in fence.find()])
    for running in (first, second):
        outcome = running.wait(WAIT_S)
        assert outcome is not None and outcome.signal in (signal.SIGTERM, signal.SIGKILL)


def test_a_fork_server_that_died_is_started_again_and_its_supervisors_run_on(
    fence: Fence, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    waiting = start(fence, tmp_path, f"while [ ! -e {go} ]; do sleep 0.05; done; echo ran on", 7)
    server = parent_of(parent_of(waiting.pid))
    os.kill(server, signal.SIGKILL)
    wait_until(lambda: parent_of(parent_of(waiting.pid)) != server)  # reparented once it died
    go.touch()
    outcome = waiting.wait(WAIT_S)
    assert outcome is not None and outcome.exit_code == 0
    assert (tmp_path / "7-1.log").read_text() == "ran on\n"

    after = start(fence, tmp_path, "sleep 60", 8)
    try:
        restarted = parent_of(parent_of(after.pid))
        assert restarted != server and supervisor.FORKSERVER in cmdline(restarted)
    finally:
        after.terminate("cancel", grace_s=0.0)
    outcome = after.wait(WAIT_S)
    assert outcome is not None and outcome.terminated_reason == "cancel"


def test_without_a_usable_fork_server_each_supervisor_is_a_fresh_interpreter(
    fence: Fence, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # As a host whose kernel has no pidfds answers at the fork server's start.
    monkeypatch.setattr(
        forkserver,
        "_RUN_FORKSERVER",
        "import _socket, sys; _socket.socket(fileno=0).send(b'error: no pidfd'); sys.exit(1)",
    )
    caplog.set_level(logging.WARNING, logger=forkserver.__name__)
    for job_id in (9, 10):
        running = start(fence, tmp_path, "sleep 60", job_id)
        try:
            started_by = parent_of(running.pid)
            assert parent_of(started_by) == os.getpid()
            assert supervisor_identity(started_by) == (fence.installation, NODE, job_id, 1)
        finally:
            running.terminate("cancel", grace_s=0.0)
        outcome = running.wait(WAIT_S)
        assert outcome is not None and outcome.terminated_reason == "cancel"
    # Tried once, said once.
    assert forkserver.fork_server(fence.installation, NODE).unusable == "error: no pidfd"
    assert [r.getMessage() for r in caplog.records] == [
        "supervisors start as fresh interpreters on n1 (no fork server: error: no pidfd)"
    ]


# A fork server that dies between a request and its answer, after its child got the
# request's pipes: that child's last words must not be read as the next try's.
_DIES_MID_REQUEST = """
import _socket, marshal, os, sys
server = _socket.socket(fileno=0)
server.send(b"ready")
_, ancillary, _, _ = server.recvmsg(64, _socket.CMSG_SPACE(12))
status = int.from_bytes(ancillary[0][2][8:12], sys.byteorder)
said = marshal.dumps({"error": "from the child of a fork server that died"})
os.write(status, len(said).to_bytes(4, "big") + said)
sys.exit(1)
"""


def test_a_fork_server_dying_mid_request_leaves_the_next_try_a_clean_status_pipe(
    fence: Fence, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(forkserver, "_RUN_FORKSERVER", _DIES_MID_REQUEST)
    caplog.set_level(logging.WARNING, logger=forkserver.__name__)
    running = start(fence, tmp_path, "echo started afresh", 11)
    outcome = running.wait(WAIT_S)
    assert outcome is not None and outcome.exit_code == 0
    assert (tmp_path / "11-1.log").read_text() == "started afresh\n"
    # Tried twice (a fork server that died is started again once), then a fresh interpreter.
    assert [r.getMessage() for r in caplog.records] == [
        "supervisor fork server for n1: it left",
        "supervisor fork server for n1: it left",
    ]


# A fork server whose children fail before they are supervisors (here: in setsid).
_CHILDREN_CANNOT_SETSID = f"""
import os, sys
sys.path.append({os.path.dirname(supervisor.__file__)!r})
import supervisor
def refuse():
    raise OSError("setsid refused here")
os.setsid = refuse
sys.exit(supervisor.serve(sys.argv))
"""


def test_a_child_of_the_fork_server_that_fails_before_supervising_says_why(
    fence: Fence, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forkserver, "_RUN_FORKSERVER", _CHILDREN_CANNOT_SETSID)
    # Its reason, not "the job's supervisor failed to start it".
    with pytest.raises(LaunchError, match=re.escape("supervisor: OSError('setsid refused here')")):
        start(fence, tmp_path, "true", 12)


def test_status_and_pidfd_numbered_past_select_s_limit_are_waited_for(
    fence: Fence, tmp_path: Path
) -> None:
    """An agent running many attempts holds descriptors numbered over 1,024 (FD_SETSIZE),
    which select() refuses with ValueError."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the open-files limit ({hard}) is under 2048")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    try:
        read_end, write_end = os.pipe()
        high = os.dup2(read_end, 2000)
        os.close(read_end)
        pipe = _StatusPipe(high)
        assert pipe.read(0.01) is None  # nothing yet: waited for, not refused
        os.write(write_end, supervisor.frame({"pid": 1}))
        os.close(write_end)
        assert pipe.read(WAIT_S) == {"pid": 1}
        assert pipe.read(WAIT_S) is None and pipe.closed
        pipe.close()

        child = os.fork()
        if child == 0:
            os._exit(0)
        pidfd = os.pidfd_open(child)
        forked = forkserver.ForkedSupervisor(child, os.dup2(pidfd, 2001), BytesIO(), BytesIO(), -1)
        os.close(pidfd)
        assert forked.wait(WAIT_S) is None
        os.waitpid(child, 0)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
