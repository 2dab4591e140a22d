"""Job runner: real subprocesses, real signals, bounded waits (no fixed long sleeps)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.support import installation_of
from tests.support.wait import WAIT_S, wait_until
from workers.agent import accounts, supervisor
from workers.agent.fence import Fence, choose_fence
from workers.agent.runner import (
    SUPERVISOR_SCRIPT,
    JobLaunch,
    LaunchError,
    Outcome,
    RunningProcess,
    classify,
    distributed_env,
    job_environment,
    start_job,
    stop_groups,
)

_fence: list[Fence] = []


@pytest.fixture(autouse=True)
def fence(tmp_path: Path) -> Iterator[Fence]:
    """The strongest fence this host has, of an installation of the test's own; whatever
    a test leaves in it is ended at teardown."""
    made = choose_fence(installation_of(tmp_path), "n1")
    _fence[:] = [made]
    yield made
    stop_groups([(group, 0.0) for group in made.find()])
    for group in made.find():
        group.remove()


def start(spec: JobLaunch) -> RunningProcess:
    return start_job(spec, fence=_fence[0])


def launch(tmp_path: Path, command: list[str] | str, **overrides: object) -> JobLaunch:
    fields: dict[str, object] = {
        "command": command,
        "workdir": tmp_path,
        "job_id": 1,
        "attempt": 1,
        "log_path": tmp_path / "logs" / "job-1" / "attempt-1.log",
        "grace_s": 2.0,
    }
    fields.update(overrides)
    return JobLaunch(**fields)  # type: ignore[arg-type]


def run_to_end(spec: JobLaunch) -> tuple[Outcome, str]:
    running = start(spec)
    outcome = running.wait(WAIT_S)
    assert outcome is not None, "job did not finish in time"
    return outcome, Path(spec.log_path).read_text()


def env_of(log_text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in log_text.splitlines() if "=" in line)
    return {key: value for key, value in pairs}


@pytest.fixture
def reap() -> Iterator[list[RunningProcess]]:
    """Processes a test started; anything still running is killed at teardown."""
    started: list[RunningProcess] = []
    yield started
    for running in started:
        if running.poll() is None:
            running.terminate("cancel", grace_s=0.1, timeout_s=WAIT_S)


# -- environment ---------------------------------------------------------------


def test_cuda_visible_devices_is_exactly_the_allocated_indices(tmp_path: Path) -> None:
    spec = launch(tmp_path, 'printf "[%s]" "$CUDA_VISIBLE_DEVICES"', gpu_indices=(1, 3))
    outcome, log = run_to_end(spec)
    assert log == "[1,3]"
    assert classify(outcome) == "SUCCEEDED"


def test_cuda_visible_devices_names_the_gpus_by_uuid_when_given(tmp_path: Path) -> None:
    spec = launch(
        tmp_path,
        'printf "[%s %s]" "$CUDA_VISIBLE_DEVICES" "$CUDA_DEVICE_ORDER"',
        gpu_indices=(1, 3),
        gpu_uuids=("GPU-bbbb", "GPU-dddd"),
    )
    assert run_to_end(spec)[1] == "[GPU-bbbb,GPU-dddd PCI_BUS_ID]"


def test_cuda_visible_devices_is_empty_not_unset_without_gpus(tmp_path: Path) -> None:
    # Unset would let CUDA see every GPU on the node; empty means none.
    _, log = run_to_end(launch(tmp_path, 'printf "[%s]" "${CUDA_VISIBLE_DEVICES-unset}"'))
    assert log == "[]"


def test_env_is_clean_base_plus_job_env_and_ours_cannot_be_overridden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_SECRET_TOKEN", "do-not-leak")
    monkeypatch.setenv("LANG", "en_GB.UTF-8")
    spec = launch(
        tmp_path,
        ["env"],
        gpu_indices=(2,),
        job_id=42,
        attempt=3,
        env={"FOO": "bar", "LANG": "C", "CUDA_VISIBLE_DEVICES": "0,1,2,3", "GPUSCHED_JOB_ID": "x"},
    )
    outcome, log = run_to_end(spec)
    env = env_of(log)
    assert outcome.exit_code == 0
    assert "AGENT_SECRET_TOKEN" not in env
    assert env["FOO"] == "bar"
    assert env["LANG"] == "C"  # the job's env wins over the base
    assert env["PATH"] == os.environ["PATH"]
    assert env["HOME"]
    assert env["CUDA_VISIBLE_DEVICES"] == "2"  # ours win over the job's
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["GPUSCHED_JOB_ID"] == "42"
    assert env["GPUSCHED_ATTEMPT"] == "3"
    assert env["GPUSCHED_GRACE_S"] == "2"  # the time it has to checkpoint after SIGTERM
    assert "MASTER_ADDR" not in env  # single GPU: no gang


def test_torchrun_variables_for_rank_1_of_two_nodes_with_four_gpus(tmp_path: Path) -> None:
    spec = launch(
        tmp_path,
        ["env"],
        gpu_indices=(4, 5, 6, 7),
        master_addr="10.0.0.1",
        master_port=29500,
        world_size=8,
        node_rank=1,
        nproc_per_node=4,
    )
    expected = {
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "WORLD_SIZE": "8",
        "RANK": "4",
        "NODE_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
        "PET_NPROC_PER_NODE": "4",
        "PET_MASTER_ADDR": "10.0.0.1",
        "PET_MASTER_PORT": "29500",
    }
    assert distributed_env(spec) == expected
    _, log = run_to_end(spec)
    env = env_of(log)
    assert {key: env[key] for key in expected} == expected
    assert env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"


def test_single_node_multi_gpu_gets_local_rendezvous(tmp_path: Path) -> None:
    env = job_environment(launch(tmp_path, "true", gpu_indices=(0, 1)), agent_env={})
    assert env["MASTER_ADDR"] == "127.0.0.1"
    assert 0 < int(env["MASTER_PORT"]) < 65536
    assert (env["WORLD_SIZE"], env["RANK"], env["LOCAL_WORLD_SIZE"]) == ("2", "0", "2")
    assert env["PATH"]  # default PATH even from an empty agent env


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"world_size": 8, "nproc_per_node": 4}, "master_addr"),
        ({"world_size": 6, "nproc_per_node": 4, "master_addr": "a", "master_port": 1}, "multiple"),
        (
            {
                "world_size": 8,
                "nproc_per_node": 4,
                "node_rank": 2,
                "master_addr": "a",
                "master_port": 1,
            },
            "node_rank",
        ),
    ],
)
def test_inconsistent_gang_is_a_launch_error(
    tmp_path: Path, overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(LaunchError, match=message):
        start(launch(tmp_path, "true", gpu_indices=(0, 1, 2, 3), **overrides))


# -- launch errors ---------------------------------------------------------------


def test_missing_workdir_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    with pytest.raises(LaunchError, match=r"no-such-dir.*does not exist"):
        start(launch(tmp_path, "true", workdir=missing))


def test_missing_executable_is_a_launch_error_and_logged(tmp_path: Path) -> None:
    spec = launch(tmp_path, ["/nonexistent/bin/train"])
    with pytest.raises(LaunchError, match="cannot start"):
        start(spec)
    assert "cannot start" in Path(spec.log_path).read_text()


def test_an_unknown_account_or_uid_0_is_unusable() -> None:
    with pytest.raises(accounts.AccountUnusable, match="no such account"):
        accounts.resolve("no-such-user-gpusched")
    with pytest.raises(accounts.AccountUnusable, match="uid 0"):
        accounts.resolve("root")
    assert accounts.resolve("root", uid0_allowed={"root"}).uid == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs root")
def test_the_job_runs_as_its_account_with_its_groups_home_and_umask_077(tmp_path: Path) -> None:
    spec = launch(
        tmp_path,
        'echo "$(id -u):$(id -g):$(id -G):$HOME:$USER:$(umask)"',
        account=accounts.resolve("nobody"),
        workdir="/",
    )
    outcome, _ = run_to_end(spec)
    assert outcome.exit_code == 0
    log = Path(spec.log_path)
    uid, gid, groups, home, user, umask = log.read_text().strip().split(":")
    assert (uid, gid, user) == ("65534", "65534", "nobody")
    assert "0" not in groups.split()  # root's groups are gone
    assert home == "/nonexistent"
    assert umask == "0077"
    # Its log is its own, and nobody else's.
    info = log.stat()
    assert (info.st_uid, info.st_mode & 0o777) == (65534, 0o600)


# -- exits, signals, termination ---------------------------------------------------


@pytest.mark.parametrize(("code", "result"), [(0, "SUCCEEDED"), (3, "FAILED")])
def test_exit_code_is_propagated(tmp_path: Path, code: int, result: str) -> None:
    outcome, _ = run_to_end(launch(tmp_path, ["sh", "-c", f"exit {code}"]))
    assert outcome.exit_code == code
    assert outcome.signal is None
    assert outcome.terminated_reason is None
    assert classify(outcome) == result


def test_killed_by_someone_else_is_failed_with_the_signal(
    tmp_path: Path, reap: list[RunningProcess]
) -> None:
    running = start(launch(tmp_path, ["sleep", "30"]))
    reap.append(running)
    os.kill(running.pid, signal.SIGKILL)  # e.g. the kernel OOM killer
    outcome = running.wait(WAIT_S)
    assert outcome is not None
    assert (outcome.exit_code, outcome.signal) == (None, signal.SIGKILL)
    assert classify(outcome) == "FAILED"
    assert "SIGKILL" in outcome.describe()


def test_timeout_sends_sigterm_then_sigkill_to_a_child_that_ignores_sigterm(
    tmp_path: Path,
) -> None:
    spec = launch(tmp_path, 'trap "" TERM; echo ready; sleep 30', max_runtime_s=60, grace_s=0.3)
    running = start(spec)
    # The trap is set before the limit is reached (a SIGTERM before it would simply end
    # the shell, however slowly a loaded machine starts it); then a limit already past.
    assert wait_until(lambda: "ready" in Path(spec.log_path).read_text())
    limited = time.monotonic()
    running.set_time_limit(0.1)
    outcome = running.wait(WAIT_S)
    elapsed = time.monotonic() - limited
    assert outcome is not None
    assert outcome.timed_out
    assert outcome.terminated_reason == "timeout"
    assert outcome.signal == signal.SIGKILL  # SIGTERM was ignored
    assert classify(outcome) == "TIMED_OUT"
    assert 0.3 <= elapsed < 29.0  # the grace at least; the 30 s sleep was cut short
    log = Path(spec.log_path).read_text()
    assert "SIGTERM" in log and "SIGKILL" in log
    assert wait_until(lambda: not running.pids())  # every process of the job is gone


def test_cancel_of_a_job_that_honours_sigterm_does_not_wait_for_the_grace(
    tmp_path: Path,
) -> None:
    running = start(launch(tmp_path, ["sleep", "30"], grace_s=20.0))
    started = time.monotonic()
    outcome = running.terminate("cancel", timeout_s=WAIT_S)
    assert outcome is not None
    assert time.monotonic() - started < 10.0  # half the grace: it did not wait for it
    assert outcome.signal == signal.SIGTERM
    assert classify(outcome) == "CANCELLED"


def test_terminating_again_with_a_shorter_grace_kills_sooner_never_later(
    tmp_path: Path,
) -> None:
    spec = launch(tmp_path, 'trap "" TERM; echo ready; sleep 60 & wait', grace_s=60.0)
    running = start(spec)
    assert wait_until(lambda: "ready" in Path(spec.log_path).read_text())
    assert running.terminate("cancel", wait=False) is None
    assert wait_until(lambda: "sending SIGTERM" in Path(spec.log_path).read_text())
    assert running.poll() is None  # SIGTERM ignored; 60 s of grace left
    started = time.monotonic()
    # A longer grace asked later changes nothing; a shorter one brings SIGKILL forward.
    assert running.terminate("preempt", grace_s=120.0, wait=False) is None
    outcome = running.terminate("cancel", grace_s=0.0, timeout_s=WAIT_S)
    assert outcome is not None and outcome.signal == signal.SIGKILL
    assert time.monotonic() - started < 30.0  # half the 60 s grace it had: brought forward
    assert classify(outcome) == "CANCELLED"  # the first reason still wins
    log = Path(spec.log_path).read_text()
    assert "grace period shortened: SIGKILL in 0s" in log
    assert "SIGKILL in 120s" not in log


def test_preempted_job_that_checkpoints_and_exits_zero_is_still_preempted(
    tmp_path: Path,
) -> None:
    spec = launch(tmp_path, 'trap "echo checkpointed; exit 0" TERM; echo ready; sleep 30 & wait')
    running = start(spec)
    assert wait_until(lambda: "ready" in Path(spec.log_path).read_text())
    outcome = running.terminate("preempt", timeout_s=WAIT_S)
    assert outcome is not None
    assert outcome.exit_code == 0
    assert classify(outcome) == "PREEMPTED"
    assert "checkpointed" in Path(spec.log_path).read_text()
    # The first reason wins; terminating a finished job changes nothing.
    assert running.terminate("cancel", timeout_s=WAIT_S) == outcome


def test_terminate_kills_every_process_of_the_job_including_grandchildren(
    tmp_path: Path,
) -> None:
    # A subshell that ignores SIGTERM and its own child (a grandchild of ours).
    command = '(trap "" TERM; sleep 60 & wait) & sleep 60 & echo ready; wait'
    spec = launch(tmp_path, command)
    running = start(spec)
    assert wait_until(lambda: "ready" in Path(spec.log_path).read_text())
    assert wait_until(lambda: len(running.pids()) >= 4)  # sh, subshell, 2 sleeps
    members = running.pids()
    started = time.monotonic()
    outcome = running.terminate("cancel", grace_s=0.5, timeout_s=WAIT_S)
    assert outcome is not None
    # The main shell died on SIGTERM at once, but the subshell that ignores it
    # still got its grace period before the SIGKILL.
    assert 0.5 <= time.monotonic() - started < 30.0  # the grace at least; not the 60 s sleeps
    assert "SIGKILL" in Path(spec.log_path).read_text()
    assert wait_until(lambda: all(not alive(pid) for pid in members))


def test_max_runtime_leaves_a_fast_job_alone(tmp_path: Path) -> None:
    outcome, _ = run_to_end(launch(tmp_path, "true", max_runtime_s=30))
    assert classify(outcome) == "SUCCEEDED"
    assert not outcome.timed_out


def test_leftover_stragglers_are_killed_when_the_main_process_exits(tmp_path: Path) -> None:
    spec = launch(tmp_path, "sleep 60 & echo $!")
    outcome, log = run_to_end(spec)
    straggler = int(log.strip())
    assert outcome.exit_code == 0
    assert wait_until(lambda: not alive(straggler))


# -- the supervisor's start ----------------------------------------------------------

# What the supervisor's imports cost before (17 of 20 ms): JSON pulls in `re` and `enum`,
# `signal` pulls in `enum`, `contextlib` pulls in `collections` and `functools`.
_SLOW_TO_IMPORT = {
    "json",
    "re",
    "enum",
    "signal",
    "contextlib",
    "collections",
    "functools",
    "typing",
}


def test_the_supervisor_starts_without_the_slow_standard_modules() -> None:
    # Every attempt of every job starts one, so its imports are on every job's path.
    started = subprocess.run(
        [sys.executable, "-I", "-S", "-X", "importtime", SUPERVISOR_SCRIPT],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert started.returncode == 2, started.stderr  # its usage: the imports have run
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in started.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "ctypes" in imported  # the list is read right
    assert not imported & _SLOW_TO_IMPORT


def test_supervisor_messages_are_read_whole_however_the_pipe_splits_them() -> None:
    sent = [{"pid": 12}, {"error": "cannot start 'x': No such file\nor directory"}, {"exit": 0}]
    stream = b"".join(supervisor.frame(message) for message in sent)
    received, buffer = [], b""
    for byte in stream:
        buffer += bytes([byte])
        message, buffer = supervisor.read_frame(buffer)
        if message is not None:
            received.append(message)
    assert received == sent and buffer == b""
    assert supervisor.read_frame(b"\x00\x00\x00\x02ab") == ({}, b"")  # not marshal: {}


# -- logs --------------------------------------------------------------------------


def test_log_is_capped_with_one_truncation_line(tmp_path: Path) -> None:
    spec = launch(
        tmp_path, "head -c 10000 /dev/zero | tr '\\0' x; echo done-writing >&2", log_cap_bytes=1000
    )
    outcome, log = run_to_end(spec)
    assert outcome.exit_code == 0
    assert log == "x" * 1000 + "\n[gpusched] log truncated at 1000 bytes\n"
    assert outcome.log_truncated
    assert outcome.log_bytes == 1000


def test_a_chatty_job_never_blocks_on_its_pipe(tmp_path: Path) -> None:
    # 20 MB through a 4 KB cap: the pump must keep draining past the cap.
    spec = launch(tmp_path, "head -c 20000000 /dev/zero", log_cap_bytes=4096)
    outcome, _ = run_to_end(spec)
    assert outcome.exit_code == 0
    assert Path(spec.log_path).stat().st_size < 4096 + 100


def test_stdout_and_stderr_stream_into_the_log_while_running(
    tmp_path: Path, reap: list[RunningProcess]
) -> None:
    spec = launch(tmp_path, "echo out; echo err >&2; sleep 30")
    running = start(spec)
    reap.append(running)
    assert wait_until(lambda: {"out", "err"} <= set(Path(spec.log_path).read_text().split()))
    assert running.poll() is None


# -- leftovers after an agent restart --------------------------------------------------


def test_leftover_attempts_are_found_by_their_group_and_stopped(
    tmp_path: Path, fence: Fence, reap: list[RunningProcess]
) -> None:
    running = start(launch(tmp_path, ["sleep", "30"], job_id=777, attempt=2))
    reap.append(running)
    [found] = fence.find()
    assert (found.key.job_id, found.key.attempt) == (777, 2)
    assert running.pid in found.pids()
    assert os.getpid() not in found.pids()

    assert stop_groups([(found, 2.0)])
    outcome = running.wait(WAIT_S)
    assert outcome is not None and outcome.signal == signal.SIGTERM
    assert fence.find() == []


def test_leftover_groups_are_stopped_at_once_each_with_its_own_grace(
    tmp_path: Path, fence: Fence, reap: list[RunningProcess]
) -> None:
    # Both jobs checkpoint for 3 s on SIGTERM. The first is given 15 s of grace and
    # finishes its checkpoint; the second 0.3 s and is killed mid-checkpoint (seconds
    # apart, so a loaded machine cannot blur them). Stopped one after the other, the
    # second would have waited for the first's whole checkpoint before its SIGTERM.
    checkpoint = (
        "trap 'sleep 3; echo saved > ckpt-$GPUSCHED_JOB_ID; exit 0' TERM; echo ready; "
        "sleep 60 & wait"
    )
    patient, hasty = (
        start(launch(tmp_path, checkpoint, job_id=i, log_path=tmp_path / str(i))) for i in (71, 72)
    )
    reap.extend([patient, hasty])

    # Both have set their trap (a SIGTERM before it would just end the shell).
    def ready(log: str) -> bool:
        return (tmp_path / log).exists() and "ready" in (tmp_path / log).read_text()

    assert wait_until(lambda: ready("71") and ready("72"))
    groups = {g.key.job_id: g for g in fence.find()}
    started = time.monotonic()
    assert stop_groups([(groups[71], 15.0), (groups[72], 0.3)])
    # About 3 s (the patient one's checkpoint); never more than the longest grace plus
    # the time SIGKILL is given to take (runner._KILL_WAIT_S).
    assert time.monotonic() - started < 15.0 + 5.0
    assert (tmp_path / "ckpt-71").read_text() == "saved\n"
    assert not (tmp_path / "ckpt-72").exists()
    hasty_outcome = hasty.wait(WAIT_S)
    assert hasty_outcome is not None and hasty_outcome.signal == signal.SIGKILL


def test_classify_table() -> None:
    def outcome(**kwargs: object) -> Outcome:
        base: dict[str, object] = {
            "exit_code": 0,
            "signal": None,
            "timed_out": False,
            "terminated_reason": None,
        }
        base.update(kwargs)
        return Outcome(**base)  # type: ignore[arg-type]

    assert classify(outcome()) == "SUCCEEDED"
    assert classify(outcome(exit_code=1)) == "FAILED"
    assert classify(outcome(exit_code=None, signal=9)) == "FAILED"
    assert (
        classify(outcome(exit_code=None, signal=9, timed_out=True, terminated_reason="timeout"))
        == "TIMED_OUT"
    )
    assert classify(outcome(exit_code=0, terminated_reason="cancel")) == "CANCELLED"
    assert classify(outcome(exit_code=None, signal=15, terminated_reason="preempt")) == "PREEMPTED"
    assert classify(outcome(exit_code=0, terminated_reason="requeue")) == "PREEMPTED"


# -- helpers -----------------------------------------------------------------------------


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return state[state.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def test_unwritable_log_path_is_a_launch_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(LaunchError, match="cannot create log file"):
        start(launch(tmp_path, "true", log_path=blocker / "attempt-1.log"))


def test_a_time_limit_moved_while_running_is_the_one_enforced(
    tmp_path: Path, reap: list[RunningProcess]
) -> None:
    # scontrol update TimeLimit= on a running job: extended, it outlives its first limit;
    # shortened to a time already past, it ends at once, as a timeout.
    # A first limit the test's next step comes well within, even on a loaded machine.
    running = start(launch(tmp_path, ["sleep", "30"], max_runtime_s=3, grace_s=0.2))
    reap.append(running)
    running.set_time_limit(60)
    assert running.wait(3.5) is None
    running.set_time_limit(None)  # no limit
    assert running.wait(0.3) is None
    running.set_time_limit(1.0)
    outcome = running.wait(WAIT_S)
    assert outcome is not None and outcome.terminated_reason == "timeout"
    assert classify(outcome) == "TIMED_OUT"
    log = Path(running.log_path).read_text()
    assert "time limit changed: 60s from the start" in log
    assert "time limit changed: none" in log
