"""Run one job attempt, with no Celery in sight.

The agent worker calls :func:`start_job` and then waits, polls or terminates
the returned :class:`RunningProcess`. What this module guarantees:

- the job sees exactly its GPUs (``CUDA_VISIBLE_DEVICES``) and the torchrun
  variables of its gang, in a clean environment (the agent's secrets and
  settings do not leak into user code);
- the job runs as the account it is given (uid, gid, groups, HOME, umask 077),
  started by its own supervisor (workers/agent/supervisor.py) inside its own
  group of the node's fence (workers/agent/fence.py: a cgroup, or the
  supervisor's descendants), so cancel/preempt/timeout reach every process it
  started, ``setsid`` and double forks included: SIGTERM to the group,
  ``grace_s`` to checkpoint, then SIGKILL to the group;
- when the main process exits, anything left in its group is killed, so the
  GPUs the scheduler frees are really free; the CPU time and peak memory the
  group used come back in the outcome;
- stdout+stderr go to the attempt's log file (the job's account's, 0600)
  through a pump thread with a size cap, so a chatty job can neither block on
  a full pipe nor fill the disk.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from workers.agent import supervisor
from workers.agent.accounts import Account
from workers.agent.fence import Fence, FenceError, GpuDevice, GroupKey, JobGroup, Usage
from workers.agent.forkserver import SupervisorProcess, fork_server, readable

logger = logging.getLogger(__name__)

# requeue: stopped by its owner to go back to the queue (scontrol requeue); ends as a
# preemption does.
TerminateReason = Literal["cancel", "preempt", "requeue", "timeout"]
JobResult = Literal["SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "PREEMPTED"]
TERMINATE_REASONS: tuple[TerminateReason, ...] = ("cancel", "preempt", "requeue", "timeout")

JOB_ID_ENV = "GPUSCHED_JOB_ID"
ATTEMPT_ENV = "GPUSCHED_ATTEMPT"
# The job's grace period: how long it has to checkpoint after SIGTERM.
GRACE_ENV = "GPUSCHED_GRACE_S"
# The node it runs on (for the job's own information: nothing finds jobs by it).
NODE_ENV = "GPUSCHED_NODE"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_LOG_CAP_BYTES = 64 * 1024 * 1024
# How long to wait for the log pump to drain after the job's group is gone (a process
# in uninterruptible sleep may hold the pipe a while).
_PUMP_DRAIN_TIMEOUT_S = 5.0
_SUPERVISOR_POLL_S = 0.05
# How long a group may take to vanish after SIGKILL before we give up on it.
_KILL_WAIT_S = 5.0
_READ_CHUNK = 64 * 1024
# Files a job's processes create are their owner's alone.
JOB_UMASK = 0o077
# How long the supervisor may take to start the job's program (Python's start-up on a
# busy machine), and to leave once told to.
_SUPERVISOR_START_S = 60.0
_SUPERVISOR_EXIT_S = 10.0


class LaunchError(ValueError):
    """The job cannot be started as specified (bad workdir, unknown user ...).
    The message is meant for the job's owner."""


@dataclass(frozen=True)
class JobLaunch:
    """Everything needed to start one attempt of a job on this node.

    Distributed fields follow torchrun: ``world_size`` is the total number of
    worker processes in the gang (nodes x ``nproc_per_node``), ``node_rank``
    this node's rank. Left as None they default to one node running one
    worker per allocated GPU.
    """

    command: Sequence[str] | str  # argv, or a shell string run with /bin/sh -c
    workdir: str | Path
    job_id: int
    attempt: int
    log_path: str | Path
    gpu_indices: tuple[int, ...] = ()
    # The same GPUs by NVML's UUID, which CUDA_VISIBLE_DEVICES names when given: an index
    # can name another GPU after a reboot or once a GPU has gone. Empty: by index.
    gpu_uuids: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    log_cap_bytes: int = DEFAULT_LOG_CAP_BYTES
    max_runtime_s: float | None = None
    grace_s: float = 30.0
    # The account it runs as (None: the agent's own, without switching).
    account: Account | None = None
    master_addr: str | None = None
    master_port: int | None = None
    world_size: int | None = None
    node_rank: int = 0
    nproc_per_node: int | None = None
    node: str = ""
    # The text of argv[0] taken at submission (sbatch's copy of its script): run instead.
    script: str | None = None


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended. Exactly one of ``exit_code``/``signal`` is set."""

    exit_code: int | None
    signal: int | None
    timed_out: bool
    terminated_reason: TerminateReason | None
    started_at: float = 0.0  # unix seconds
    finished_at: float = 0.0
    log_bytes: int = 0
    log_truncated: bool = False
    usage: Usage = field(default_factory=Usage)

    @property
    def duration_s(self) -> float:
        return max(0.0, self.finished_at - self.started_at)

    def describe(self) -> str:
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            how = f"killed by {name}"
        else:
            how = f"exit code {self.exit_code}"
        if self.terminated_reason is not None:
            how += f" after {self.terminated_reason}"
        return how


def stop_result(reason: str | None) -> JobResult | None:
    """What an attempt stopped for `reason` ended as, however it exited: a cancelled one
    is CANCELLED, a preempted or requeued one PREEMPTED (to be requeued)."""
    if reason == "cancel":
        return "CANCELLED"
    if reason in ("preempt", "requeue"):
        return "PREEMPTED"
    if reason == "timeout":
        return "TIMED_OUT"
    return None


def classify(outcome: Outcome) -> JobResult:
    """Final state of an attempt.

    Our own termination reason wins over the exit code: a preempted job that
    checkpoints and exits 0 on SIGTERM is still PREEMPTED (it must be
    requeued), and a cancelled one is CANCELLED however it ended.
    """
    stopped = stop_result(outcome.terminated_reason)
    if stopped is not None:
        return stopped
    if outcome.timed_out:
        return "TIMED_OUT"
    if outcome.exit_code == 0:
        return "SUCCEEDED"
    return "FAILED"


# -- environment --------------------------------------------------------------


def _free_port() -> int:
    # Racy by nature (the port may be taken before torchrun binds it), but it
    # is what torchrun --standalone does too, and only single-node gangs use it.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def distributed_env(spec: JobLaunch) -> dict[str, str]:
    """torchrun rendezvous variables for multi-GPU or multi-node gangs; empty
    for a single-GPU (or CPU-only) job.

    ``RANK`` is the global rank of this node's first worker (``node_rank *
    nproc_per_node``), which is the process's rank when one process per node
    drives its GPUs. The ``PET_*`` copies are torchrun's own environment
    fallbacks for ``--nnodes``/``--node-rank``/..., so a bare ``torchrun
    train.py`` joins the gang without the user repeating them.
    """
    nproc = spec.nproc_per_node or max(1, len(spec.gpu_indices))
    world = spec.world_size or nproc
    if nproc < 1 or world < 1:
        raise LaunchError("nproc_per_node and world_size must be >= 1")
    if world % nproc != 0:
        raise LaunchError(f"world_size {world} is not a multiple of nproc_per_node {nproc}")
    nnodes = world // nproc
    if nnodes == 1 and nproc == 1:
        return {}
    if not 0 <= spec.node_rank < nnodes:
        raise LaunchError(f"node_rank {spec.node_rank} outside 0..{nnodes - 1}")
    if nnodes > 1 and (spec.master_addr is None or spec.master_port is None):
        raise LaunchError("a multi-node job needs master_addr and master_port")
    master_addr = spec.master_addr or "127.0.0.1"
    master_port = spec.master_port if spec.master_port is not None else _free_port()
    return {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(world),
        "RANK": str(spec.node_rank * nproc),
        "NODE_RANK": str(spec.node_rank),
        "LOCAL_WORLD_SIZE": str(nproc),
        "PET_NNODES": str(nnodes),
        "PET_NODE_RANK": str(spec.node_rank),
        "PET_NPROC_PER_NODE": str(nproc),
        "PET_MASTER_ADDR": master_addr,
        "PET_MASTER_PORT": str(master_port),
    }


def job_environment(
    spec: JobLaunch,
    *,
    agent_env: Mapping[str, str] | None = None,
    home: str | None = None,
) -> dict[str, str]:
    """The job's complete environment: a clean base (PATH, HOME, LANG), the
    job's own variables over it, then ours, which the job cannot override
    (its GPUs, its identity, its gang)."""
    source = os.environ if agent_env is None else agent_env
    for key, value in spec.env.items():
        if not key or "=" in key or "\0" in key or "\0" in str(value):
            raise LaunchError(f"invalid environment variable {key!r}")
    env: dict[str, str] = {
        "PATH": source.get("PATH") or DEFAULT_PATH,
        "HOME": home or source.get("HOME") or "/",
        "LANG": source.get("LANG") or "C.UTF-8",
        # Python buffers stdout when it is a pipe; users expect live logs.
        "PYTHONUNBUFFERED": "1",
    }
    env.update({key: str(value) for key, value in spec.env.items()})
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": ",".join(spec.gpu_uuids or map(str, spec.gpu_indices)),
            # CUDA numbers GPUs fastest-first by default; NVML (and so the
            # scheduler) numbers them by PCI bus. Without this a job given indices could
            # land on GPUs other than its own; with UUIDs it keeps the job's own ordinals
            # in bus order, as the indices it was given.
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            JOB_ID_ENV: str(spec.job_id),
            ATTEMPT_ENV: str(spec.attempt),
            GRACE_ENV: f"{spec.grace_s:g}",
            NODE_ENV: spec.node,
        }
    )
    env.update(distributed_env(spec))
    return env


# -- log pump -----------------------------------------------------------------


class _LogPump(threading.Thread):
    """Copies the job's combined stdout/stderr into the log file, up to a cap.

    Past the cap it keeps reading (and discarding) so the job never blocks on
    a full pipe; it writes one truncation line instead.
    """

    def __init__(self, pipe: IO[bytes], log_file: IO[bytes], cap_bytes: int, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._pipe = pipe
        self._log = log_file
        self._cap = max(0, cap_bytes)
        self._lock = threading.Lock()
        self._at_line_start = True
        self.bytes_written = 0  # job output only, not our notes
        self.truncated = False

    def run(self) -> None:
        fd = self._pipe.fileno()
        try:
            while True:
                try:
                    chunk = os.read(fd, _READ_CHUNK)
                except OSError:
                    break
                if not chunk:
                    break
                self._write_job_output(chunk)
        finally:
            with self._lock:
                with contextlib.suppress(OSError):
                    self._pipe.close()
                with contextlib.suppress(OSError):
                    self._log.close()

    def _write_job_output(self, chunk: bytes) -> None:
        with self._lock:
            if self.truncated:
                return
            room = self._cap - self.bytes_written
            kept = chunk[:room]
            if kept:
                self._write(kept)
                self.bytes_written += len(kept)
            if len(chunk) > room:
                self.truncated = True
                self._write_line(f"[gpusched] log truncated at {self._cap} bytes")

    def note(self, text: str) -> None:
        """Add one line of ours (termination notices) so users see why their
        job stopped; notes are not counted against the cap."""
        with self._lock:
            if self._log.closed:
                return
            self._write_line(f"[gpusched] {text}")

    def _write_line(self, text: str) -> None:
        prefix = b"" if self._at_line_start else b"\n"
        self._write(prefix + text.encode() + b"\n")

    def _write(self, data: bytes) -> None:
        try:
            self._log.write(data)
            # Flushed per chunk so the agent can stream the log while the job runs.
            self._log.flush()
        except (OSError, ValueError) as exc:  # disk full or closed: keep draining the pipe
            logger.warning("cannot write job log: %s", exc)
            return
        self._at_line_start = data.endswith(b"\n")


# -- the supervisor's reports -------------------------------------------------


class _StatusPipe:
    """The supervisor's messages (`supervisor.frame`), on a pipe of their own."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = b""
        self.closed = False

    def read(self, timeout_s: float | None) -> dict[str, Any] | None:
        """The next message; None when none came within `timeout_s`, or the pipe closed."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            message, rest = supervisor.read_frame(self._buffer)
            if message is not None:
                self._buffer = rest
                return message
            if self.closed:
                return None
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not readable(self._fd, left):
                return None
            chunk = os.read(self._fd, 4096)
            if not chunk:
                self.closed = True
                continue
            self._buffer += chunk

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


# -- running process ----------------------------------------------------------


class RunningProcess:
    """A started attempt. Thread-safe; a supervisor thread reaps the process,
    enforces ``max_runtime_s`` and escalates SIGTERM to SIGKILL."""

    def __init__(
        self,
        spec: JobLaunch,
        *,
        pid: int,
        group: JobGroup,
        supervisor_proc: SupervisorProcess,
        status: _StatusPipe,
        pump: _LogPump,
        script_dir: Path | None = None,
    ) -> None:
        self.spec = spec
        self.group = group
        self._script_dir = script_dir  # removed once the attempt has ended
        self.pid = pid  # the job's first process (the supervisor's child)
        self.log_path = Path(spec.log_path)
        self.started_at = time.time()
        self._started_monotonic = time.monotonic()
        self._supervisor_proc = supervisor_proc
        self._status = status
        self._pump = pump
        self._lock = threading.Lock()
        self._reason: TerminateReason | None = None
        self._kill_deadline: float | None = None
        # When the time limit ends (monotonic); moved by set_time_limit.
        self._runtime_deadline: float | None = (
            None if spec.max_runtime_s is None else self._started_monotonic + spec.max_runtime_s
        )
        self._killed = False
        self._exited = False
        self._outcome: Outcome | None = None
        self._done = threading.Event()
        self._supervisor = threading.Thread(
            target=self._supervise, name=f"job-{spec.job_id}-{spec.attempt}-supervisor", daemon=True
        )
        self._supervisor.start()

    @property
    def terminated_reason(self) -> TerminateReason | None:
        return self._reason

    def pids(self) -> set[int]:
        """Every live process of the attempt, found by its group: whatever session or
        process group a process put itself in (torchrun's workers), it is the job's."""
        return self.group.pids()

    def poll(self) -> Outcome | None:
        """The outcome if the attempt has finished (process reaped, group
        killed, log drained), else None."""
        return self._outcome

    def wait(self, timeout_s: float | None = None) -> Outcome | None:
        """Block until finished; None if ``timeout_s`` passed first."""
        self._done.wait(timeout_s)
        return self._outcome

    def terminate(
        self,
        reason: TerminateReason,
        *,
        grace_s: float | None = None,
        wait: bool = True,
        timeout_s: float | None = None,
    ) -> Outcome | None:
        """SIGTERM every process of the attempt now, SIGKILL them ``grace_s`` later
        (default: the launch's ``grace_s``) if anything is still alive.

        Idempotent: the first reason wins, and terminating a finished attempt
        does nothing. Terminating again with a ``grace_s`` that ends sooner
        moves the SIGKILL earlier (``gpusched cancel --grace 0`` on a job stuck
        in its grace period); a later one changes nothing. With ``wait`` it
        blocks until the attempt is over (or ``timeout_s``) and returns the
        outcome."""
        if reason not in TERMINATE_REASONS:
            raise ValueError(f"reason must be one of {TERMINATE_REASONS}, not {reason!r}")
        if not self._shorten_grace(grace_s):
            self._begin_termination(reason, self.spec.grace_s if grace_s is None else grace_s)
        if wait:
            return self.wait(timeout_s)
        return self._outcome

    def set_time_limit(self, max_runtime_s: float | None) -> None:
        """Move the time limit (from the start; None: none), as `scontrol update
        TimeLimit=` on a running job. One already past ends the attempt at the next poll;
        an attempt being terminated keeps its course."""
        with self._lock:
            self._runtime_deadline = (
                None if max_runtime_s is None else self._started_monotonic + max_runtime_s
            )
        limit = "none" if max_runtime_s is None else f"{max_runtime_s:g}s from the start"
        self._pump.note(f"time limit changed: {limit}")

    def _shorten_grace(self, grace_s: float | None) -> bool:
        """For an attempt already being terminated: bring its SIGKILL forward to ``grace_s``
        from now if that is sooner. False if its termination has not begun."""
        with self._lock:
            if self._reason is None or self._exited:
                return False
            if grace_s is None or self._kill_deadline is None:
                return True
            deadline = time.monotonic() + max(0.0, grace_s)
            if deadline >= self._kill_deadline:
                return True
            self._kill_deadline = deadline
        self._pump.note(f"grace period shortened: SIGKILL in {grace_s:g}s")
        return True

    def _begin_termination(self, reason: TerminateReason, grace_s: float) -> None:
        with self._lock:
            if self._exited or self._reason is not None:
                return
            self._reason = reason
            self._kill_deadline = time.monotonic() + max(0.0, grace_s)
        logger.info(
            "job %s attempt %s: SIGTERM to its processes (%s, grace %.1fs)",
            self.spec.job_id,
            self.spec.attempt,
            reason,
            grace_s,
        )
        self._pump.note(f"sending SIGTERM to the job ({reason}); SIGKILL in {grace_s:g}s")
        self.group.signal(signal.SIGTERM)

    def _kill_if_grace_over(self, now: float) -> bool:
        """SIGKILL the group once the grace period of a termination is over.
        Returns True if it has been sent (now or before)."""
        with self._lock:
            if self._killed:
                return True
            if self._kill_deadline is None or now < self._kill_deadline:
                return False
            self._killed = True
        self._pump.note("grace period over; sending SIGKILL")
        self.group.kill(_KILL_WAIT_S)
        return True

    def _wait_main(self) -> tuple[int | None, int | None]:
        """(exit code, signal) of the job's first process, enforcing the time limit and
        the grace period meanwhile."""
        while True:
            message = self._status.read(_SUPERVISOR_POLL_S)
            if message is not None and "exit" in message:
                return int(message["exit"]), None
            if message is not None and "signal" in message:
                return None, int(message["signal"])
            if self._status.closed:
                # The supervisor died before its child did (killed by hand): whatever the
                # job still runs is stopped below; its exit status is lost.
                logger.warning("job %s attempt %s: supervisor gone", *self._ident())
                return None, signal.SIGKILL
            now = time.monotonic()
            deadline = self._runtime_deadline
            if deadline is not None and now >= deadline:
                self._begin_termination("timeout", self.spec.grace_s)  # once: reason is set
            self._kill_if_grace_over(now)

    def _ident(self) -> tuple[int, int]:
        return self.spec.job_id, self.spec.attempt

    def _supervise(self) -> None:
        exit_code, signum = self._wait_main()
        with self._lock:
            self._exited = True
            terminating = self._kill_deadline is not None
        if terminating:
            # The main process may die at once on SIGTERM (a shell wrapper) while its
            # children are still checkpointing: they get the rest of the grace period too.
            while self.group.alive() and not self._kill_if_grace_over(time.monotonic()):
                time.sleep(_SUPERVISOR_POLL_S)
        # Whatever is left would keep holding GPUs the scheduler is about to hand to
        # someone else. (A job that exits on its own has finished; its forgotten background
        # processes get no grace.)
        if not self.group.kill(_KILL_WAIT_S):
            logger.warning("job %s attempt %s: processes survive SIGKILL", *self._ident())
        usage = self._finish_supervisor()
        self._pump.join(_PUMP_DRAIN_TIMEOUT_S)
        if self._pump.is_alive():
            logger.warning("job %s attempt %s: log pipe still open after exit", *self._ident())
        _remove(self._script_dir)
        self._outcome = Outcome(
            exit_code=exit_code,
            signal=signum,
            timed_out=self._reason == "timeout",
            terminated_reason=self._reason,
            started_at=self.started_at,
            finished_at=time.time(),
            log_bytes=self._pump.bytes_written,
            log_truncated=self._pump.truncated,
            usage=usage,
        )
        self._done.set()

    def _finish_supervisor(self) -> Usage:
        """Let the supervisor go (it reaps the last of the job) and take what the attempt
        used: the fence's figures, else the supervisor's getrusage of what it reaped."""
        with contextlib.suppress(OSError):
            if self._supervisor_proc.stdin is not None:
                self._supervisor_proc.stdin.close()
        reaped: dict[str, Any] = {}
        deadline = time.monotonic() + _SUPERVISOR_EXIT_S
        while not self._status.closed and time.monotonic() < deadline:
            message = self._status.read(max(0.0, deadline - time.monotonic()))
            if message is not None and "cpu_s" in message:
                reaped = message
        self._status.close()
        try:
            self._supervisor_proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self._supervisor_proc.kill()
            self._supervisor_proc.wait()
        measured = self.group.usage()
        self.group.remove()
        cpu = measured.cpu_s
        peak = measured.memory_peak_mb
        if cpu is None and isinstance(reaped.get("cpu_s"), int | float):
            cpu = float(reaped["cpu_s"])
        if peak is None and isinstance(reaped.get("maxrss_kb"), int):
            peak = int(reaped["maxrss_kb"]) // 1024  # the biggest process's, not the sum
        return Usage(cpu_s=cpu, memory_peak_mb=peak)


SUPERVISOR_SCRIPT = supervisor.__file__
# The supervisor imported as a module, not run as a script: a script's source is compiled
# at every start (8 of its 37 ms), a module's bytecode is cached in __pycache__. Its
# directory goes last on the path, so it shadows nothing of the standard library.
_RUN_SUPERVISOR = (
    f"import sys; sys.path.append({os.path.dirname(SUPERVISOR_SCRIPT)!r}); "
    "import supervisor; sys.exit(supervisor.main(sys.argv))"
)


def start_job(
    spec: JobLaunch, *, fence: Fence, denied_devices: tuple[GpuDevice, ...] = ()
) -> RunningProcess:
    """Start one attempt in its own group of `fence` (which may not open `denied_devices`);
    raise :class:`LaunchError` if it cannot start."""
    workdir = Path(spec.workdir)
    if not workdir.is_dir():
        raise LaunchError(f"workdir {str(workdir)!r} does not exist or is not a directory")
    if isinstance(spec.command, str):
        if not spec.command.strip():
            raise LaunchError("empty command")
        argv = ["/bin/sh", "-c", spec.command]
    else:
        argv = [str(arg) for arg in spec.command]
        if not argv:
            raise LaunchError("empty command")
    if len(set(spec.gpu_indices)) != len(spec.gpu_indices) or any(i < 0 for i in spec.gpu_indices):
        raise LaunchError(f"invalid GPU indices {spec.gpu_indices!r}")
    if spec.max_runtime_s is not None and spec.max_runtime_s <= 0:
        raise LaunchError("max_runtime_s must be positive")
    account = spec.account
    env = job_environment(spec, home=account.home if account is not None else None)
    if account is not None:
        env.setdefault("USER", account.name)
        env.setdefault("LOGNAME", account.name)
    script_dir = None
    if spec.script is not None and not isinstance(spec.command, str):
        script_dir, argv[0] = _write_script(spec, argv[0], account)
    try:
        log_file = _open_log(Path(spec.log_path), account)
    except OSError as exc:
        _remove(script_dir)
        raise LaunchError(f"cannot create log file {str(spec.log_path)!r}: {exc}") from exc
    try:
        group = fence.create(spec.job_id, spec.attempt, denied=denied_devices)
    except FenceError as exc:
        log_file.close()
        _remove(script_dir)
        raise LaunchError(str(exc)) from exc
    try:
        proc, status, pid = _start_supervisor(spec, argv, env, group)
    except LaunchError as exc:
        with contextlib.suppress(OSError):
            log_file.write(f"[gpusched] {exc}\n".encode())
        log_file.close()
        group.kill(_KILL_WAIT_S)
        group.remove()
        _remove(script_dir)
        raise
    assert proc.stdout is not None
    pump = _LogPump(
        proc.stdout, log_file, spec.log_cap_bytes, name=f"job-{spec.job_id}-{spec.attempt}-log"
    )
    pump.start()  # the agent logs the start (Agent.run_job), with the job's fields
    return RunningProcess(
        spec,
        pid=pid,
        group=group,
        supervisor_proc=proc,
        status=status,
        pump=pump,
        script_dir=script_dir,
    )


def _start_supervisor(
    spec: JobLaunch, argv: list[str], env: dict[str, str], group: JobGroup
) -> tuple[SupervisorProcess, _StatusPipe, int]:
    """The attempt's supervisor, its status pipe, and the pid of the job's program once it
    runs (LaunchError with the reason if it could not be started)."""
    account = spec.account
    launch: dict[str, object] = {
        "argv": argv,
        "env": env,
        "cwd": str(spec.workdir),
        "uid": account.uid if account is not None else None,
        "gid": account.gid if account is not None else None,
        "groups": list(account.groups) if account is not None else None,
        "umask": JOB_UMASK,
        "cgroups": list(group.join_files()),
    }
    key = group.key
    forked = fork_server(key.installation, key.node).spawn(key.job_id, key.attempt)
    if forked is not None:
        proc: SupervisorProcess = forked
        status_r = forked.status
    else:
        proc, status_r = _exec_supervisor(key)
    status = _StatusPipe(status_r)
    group.bind(proc.pid)
    assert proc.stdin is not None
    try:
        proc.stdin.write(supervisor.frame(launch))
        proc.stdin.flush()
    except OSError:
        pass  # it died: its status pipe says so below
    first = status.read(_SUPERVISOR_START_S)
    if first is not None and "pid" in first:
        return proc, status, int(first["pid"])
    status.close()
    with contextlib.suppress(OSError):
        proc.stdin.close()
    proc.kill()
    proc.wait()
    if first is not None and "error" in first:
        raise LaunchError(str(first["error"]))
    code = "" if proc.returncode is None else f" (exit code {proc.returncode})"
    raise LaunchError(f"the job's supervisor failed to start it{code}")


def _exec_supervisor(key: GroupKey) -> tuple[subprocess.Popen[bytes], int]:
    """A supervisor in a fresh interpreter, where there is no fork server, and the read end
    of its status pipe."""
    status_r, status_w = os.pipe()
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-I",
                "-S",
                "-c",
                _RUN_SUPERVISOR,
                supervisor.MARKER,
                key.installation,
                key.node,
                str(key.job_id),
                str(key.attempt),
                str(status_w),
            ],
            cwd="/",
            env={},  # nothing of the agent's: the job's environment travels in `launch`
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=(status_w,),
            start_new_session=True,  # a terminal's Ctrl-C is for the agent
            close_fds=True,
        )
    except OSError as exc:
        os.close(status_r)
        raise LaunchError(f"cannot start the job's supervisor: {exc.strerror or exc}") from exc
    finally:
        os.close(status_w)
    return proc, status_r


def _open_log(path: Path, account: Account | None) -> IO[bytes]:
    """The attempt's log, the job's account's alone (0600; in a directory of the agent's,
    0700): other users' jobs cannot read it; the API serves it to those who may."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        if account is not None and os.geteuid() == 0:
            os.fchown(fd, account.uid, account.gid)
        os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return os.fdopen(fd, "wb")


def _write_script(spec: JobLaunch, program: str, account: Account | None) -> tuple[Path, str]:
    """The script's copy in a directory of its own (0700), readable only by the job's
    account: its directory and the path to run."""
    assert spec.script is not None
    try:
        directory = Path(tempfile.mkdtemp(prefix=f"gpusched-job-{spec.job_id}-{spec.attempt}-"))
        path = directory / (Path(program).name or "script")
        path.write_text(spec.script, encoding="utf-8")
        path.chmod(0o700)
        if account is not None and os.geteuid() == 0:
            for owned in (directory, path):
                os.chown(owned, account.uid, account.gid)
    except OSError as exc:
        raise LaunchError(f"cannot write the script's copy: {exc}") from exc
    return directory, str(path)


def _remove(directory: Path | None) -> None:
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


# -- stopping groups (leftovers after an agent restart, the watchdog) ------------


def stop_groups(groups: Sequence[tuple[JobGroup, float]], *, poll_s: float = 0.05) -> bool:
    """SIGTERM every group (with its grace period) at once, SIGKILL each one still alive
    when its own grace is over. All at once: one after the other, the last job would wait
    for the sum of the others' graces before it could even checkpoint. Returns True when
    no process is left in any of them."""
    start = time.monotonic()
    for group, _ in groups:
        group.signal(signal.SIGTERM)
    alive = list(groups)
    killed: set[int] = set()
    while alive:
        now = time.monotonic()
        for entry in list(alive):
            group, grace = entry
            if not group.alive():
                alive.remove(entry)
            elif id(group) in killed:
                if now >= start + grace + _KILL_WAIT_S:
                    return False  # SIGKILL did not take (uninterruptible sleep)
                group.signal(signal.SIGKILL)  # a child forked meanwhile
            elif now >= start + grace:
                group.signal(signal.SIGKILL)
                killed.add(id(group))
        if alive:
            time.sleep(poll_s)
    return True
