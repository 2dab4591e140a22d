"""Run one job attempt as a subprocess, with no Celery in sight.

The agent worker calls :func:`start_job` and then waits, polls or terminates
the returned :class:`RunningProcess`. What this module guarantees:

- the job sees exactly its GPUs (``CUDA_VISIBLE_DEVICES``) and the torchrun
  variables of its gang, in a clean environment (the agent's secrets and
  settings do not leak into user code);
- the job runs in its own process group, so cancel/preempt/timeout reach
  every process it started: SIGTERM to the group, ``grace_s`` to checkpoint,
  then SIGKILL to the group;
- when the main process exits, anything left in its group is killed, so the
  GPUs the scheduler frees are really free;
- stdout+stderr go to the attempt's log file through a pump thread with a
  size cap, so a chatty job can neither block on a full pipe nor fill the disk;
- every process carries ``GPUSCHED_JOB_ID``/``GPUSCHED_ATTEMPT`` in its
  environment, so a restarted agent can find and kill leftovers of attempts
  that are no longer its own (:func:`find_leftover_processes`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

logger = logging.getLogger(__name__)

# requeue: stopped by its owner to go back to the queue (scontrol requeue); ends as a
# preemption does.
TerminateReason = Literal["cancel", "preempt", "requeue", "timeout"]
JobResult = Literal["SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "PREEMPTED"]
TERMINATE_REASONS: tuple[TerminateReason, ...] = ("cancel", "preempt", "requeue", "timeout")

JOB_ID_ENV = "GPUSCHED_JOB_ID"
ATTEMPT_ENV = "GPUSCHED_ATTEMPT"
# The job's grace period: the job reads how long it has to checkpoint after SIGTERM, and
# a watchdog or restarted agent that finds the process gives it the same time.
GRACE_ENV = "GPUSCHED_GRACE_S"
# Several agents may share one machine (simulated nodes): each kills only its own leftovers.
NODE_ENV = "GPUSCHED_NODE"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_LOG_CAP_BYTES = 64 * 1024 * 1024
# How long to wait for the log pump to drain after the job's group is gone; a
# process that escaped the group (setsid) may hold the pipe open forever.
_PUMP_DRAIN_TIMEOUT_S = 5.0
_SUPERVISOR_POLL_S = 0.05
# How long a group may take to vanish after SIGKILL before we give up on it.
_KILL_WAIT_S = 5.0
_READ_CHUNK = 64 * 1024


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
    job_id: str | int
    attempt: int
    log_path: str | Path
    gpu_indices: tuple[int, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    log_cap_bytes: int = DEFAULT_LOG_CAP_BYTES
    max_runtime_s: float | None = None
    grace_s: float = 30.0
    run_as_user: str | None = None
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
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in spec.gpu_indices),
            # CUDA numbers GPUs fastest-first by default; NVML (and so the
            # scheduler) numbers them by PCI bus. Without this the job could
            # land on GPUs other than the ones it was given.
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            JOB_ID_ENV: str(spec.job_id),
            ATTEMPT_ENV: str(spec.attempt),
            GRACE_ENV: f"{spec.grace_s:g}",
            NODE_ENV: spec.node,
        }
    )
    env.update(distributed_env(spec))
    return env


def _user_switch(run_as_user: str | None) -> tuple[dict[str, Any], pwd.struct_passwd | None]:
    """Popen keyword arguments to run as ``run_as_user``, and its passwd entry."""
    if run_as_user is None:
        return {}, None
    try:
        entry = pwd.getpwnam(run_as_user)
    except KeyError:
        raise LaunchError(f"unknown user {run_as_user!r}") from None
    if os.geteuid() != 0:
        if entry.pw_uid == os.geteuid():
            return {}, entry
        raise LaunchError(f"cannot run as {run_as_user!r}: the agent is not running as root")
    # The user's own groups, not root's: dropping to a user must not keep
    # root's supplementary groups (and must keep the user's data groups).
    groups = [g for g in os.getgrouplist(entry.pw_name, entry.pw_gid) if g != entry.pw_gid]
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": groups}, entry


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


# -- running process ----------------------------------------------------------


class RunningProcess:
    """A started attempt. Thread-safe; a supervisor thread reaps the process,
    enforces ``max_runtime_s`` and escalates SIGTERM to SIGKILL."""

    def __init__(
        self,
        spec: JobLaunch,
        proc: subprocess.Popen[bytes],
        pump: _LogPump,
        script_dir: Path | None = None,
    ) -> None:
        self.spec = spec
        self._script_dir = script_dir  # removed once the attempt has ended
        self.pid = proc.pid
        # start_new_session=True makes the child a session and group leader.
        self.pgid = proc.pid
        self.log_path = Path(spec.log_path)
        self.started_at = time.time()
        self._started_monotonic = time.monotonic()
        self._proc = proc
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
        """SIGTERM the whole process group now, SIGKILL it ``grace_s`` later
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
            "job %s attempt %s: SIGTERM to group %d (%s, grace %.1fs)",
            self.spec.job_id,
            self.spec.attempt,
            self.pgid,
            reason,
            grace_s,
        )
        self._pump.note(f"sending SIGTERM to the job ({reason}); SIGKILL in {grace_s:g}s")
        _signal_group(self.pgid, signal.SIGTERM)

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
        _signal_group(self.pgid, signal.SIGKILL)
        return True

    def _supervise(self) -> None:
        returncode: int | None = None
        while returncode is None:
            try:
                returncode = self._proc.wait(timeout=_SUPERVISOR_POLL_S)
            except subprocess.TimeoutExpired:
                pass
            else:
                break
            now = time.monotonic()
            deadline = self._runtime_deadline
            if deadline is not None and now >= deadline:
                self._begin_termination("timeout", self.spec.grace_s)  # once: reason is set
            self._kill_if_grace_over(now)
        with self._lock:
            self._exited = True
            terminating = self._kill_deadline is not None
        if terminating:
            # The main process may die at once on SIGTERM (a shell wrapper)
            # while its children are still checkpointing: they get the rest of
            # the grace period too.
            while process_group_alive(self.pgid) and not self._kill_if_grace_over(time.monotonic()):
                time.sleep(_SUPERVISOR_POLL_S)
        # Whatever is left in the group would keep holding GPUs the scheduler
        # is about to hand to someone else. (A job that exits on its own has
        # finished; its forgotten background processes get no grace.)
        _signal_group(self.pgid, signal.SIGKILL)
        self._pump.join(_PUMP_DRAIN_TIMEOUT_S)
        if self._pump.is_alive():
            logger.warning(
                "job %s attempt %s: log pipe still open after exit (a process left its group)",
                self.spec.job_id,
                self.spec.attempt,
            )
        _remove(self._script_dir)
        self._outcome = Outcome(
            exit_code=returncode if returncode >= 0 else None,
            signal=-returncode if returncode < 0 else None,
            timed_out=self._reason == "timeout",
            terminated_reason=self._reason,
            started_at=self.started_at,
            finished_at=time.time(),
            log_bytes=self._pump.bytes_written,
            log_truncated=self._pump.truncated,
        )
        self._done.set()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def start_job(spec: JobLaunch) -> RunningProcess:
    """Start one attempt; raise :class:`LaunchError` if it cannot start."""
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
    user_kwargs, user_entry = _user_switch(spec.run_as_user)
    env = job_environment(spec, home=user_entry.pw_dir if user_entry is not None else None)
    script_dir = None
    if spec.script is not None and not isinstance(spec.command, str):
        script_dir, argv[0] = _write_script(spec, argv[0], user_entry)
    if user_entry is not None:
        env.setdefault("USER", user_entry.pw_name)
        env.setdefault("LOGNAME", user_entry.pw_name)

    log_path = Path(spec.log_path)
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = log_path.open("wb")
    except OSError as exc:
        _remove(script_dir)
        raise LaunchError(f"cannot create log file {str(log_path)!r}: {exc}") from exc
    try:
        proc = subprocess.Popen(
            argv,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            **user_kwargs,
        )
    except OSError as exc:
        message = f"cannot start {argv[0]!r}: {exc.strerror or exc}"
        with contextlib.suppress(OSError):
            log_file.write(f"[gpusched] {message}\n".encode())
        log_file.close()
        _remove(script_dir)
        raise LaunchError(message) from exc
    assert proc.stdout is not None
    pump = _LogPump(
        proc.stdout, log_file, spec.log_cap_bytes, name=f"job-{spec.job_id}-{spec.attempt}-log"
    )
    pump.start()
    logger.info(
        "job %s attempt %s started: pid %d, GPUs [%s]",
        spec.job_id,
        spec.attempt,
        proc.pid,
        env["CUDA_VISIBLE_DEVICES"],
    )
    return RunningProcess(spec, proc, pump, script_dir)


def _write_script(
    spec: JobLaunch, program: str, user: pwd.struct_passwd | None
) -> tuple[Path, str]:
    """The script's copy in a directory of its own, readable only by the job's user: its
    directory and the path to run."""
    assert spec.script is not None
    try:
        directory = Path(tempfile.mkdtemp(prefix=f"gpusched-job-{spec.job_id}-{spec.attempt}-"))
        path = directory / (Path(program).name or "script")
        path.write_text(spec.script, encoding="utf-8")
        path.chmod(0o700)
        if user is not None and os.geteuid() == 0:
            for owned in (directory, path):
                os.chown(owned, user.pw_uid, user.pw_gid)
    except OSError as exc:
        raise LaunchError(f"cannot write the script's copy: {exc}") from exc
    return directory, str(path)


def _remove(directory: Path | None) -> None:
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


# -- leftovers after an agent restart ----------------------------------------


@dataclass(frozen=True)
class LeftoverProcess:
    pid: int
    pgid: int
    job_id: str
    attempt: int | None
    grace_s: float | None = None  # the job's own (GPUSCHED_GRACE_S), if it had one


def _read_stat(pid: int, proc_root: Path) -> tuple[str, int] | None:
    """(state, pgrp) of a process, or None if it is gone."""
    try:
        raw = (proc_root / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # comm may contain spaces and parentheses; the fields after the last ')' do not.
    fields = raw[raw.rfind(b")") + 2 :].split()
    if len(fields) < 3:
        return None
    return fields[0].decode(), int(fields[2])


def _pids(proc_root: Path) -> list[int]:
    try:
        return [int(entry.name) for entry in proc_root.iterdir() if entry.name.isdigit()]
    except OSError:
        return []


def process_group_alive(pgid: int, *, proc_root: str | Path = "/proc") -> bool:
    """Whether any live (non-zombie) process is in group ``pgid``.

    Zombies do not count: they hold no GPU memory, and in a container whose
    init does not reap, orphans stay zombies forever."""
    root = Path(proc_root)
    for pid in _pids(root):
        stat = _read_stat(pid, root)
        if stat is not None and stat[1] == pgid and stat[0] not in ("Z", "X"):
            return True
    return False


def find_leftover_processes(
    marker_env: str = JOB_ID_ENV,
    *,
    attempt_env: str = ATTEMPT_ENV,
    proc_root: str | Path = "/proc",
    node: str | None = None,
) -> list[LeftoverProcess]:
    """Live processes whose environment carries ``marker_env`` (started by a
    gpusched agent), with their job id and attempt, sorted by pid.

    Processes we may not read (other users, when not root) are skipped. With
    ``node``, only processes started by the agent of that node count."""
    root = Path(proc_root)
    marker = marker_env.encode() + b"="
    attempt_marker = attempt_env.encode() + b"="
    grace_marker = GRACE_ENV.encode() + b"="
    node_entry = f"{NODE_ENV}={node}".encode() if node is not None else None
    own_pid = os.getpid()
    found: list[LeftoverProcess] = []
    for pid in sorted(_pids(root)):
        if pid == own_pid:
            continue
        try:
            environ = (root / str(pid) / "environ").read_bytes()
        except OSError:
            continue
        job_id: str | None = None
        attempt: int | None = None
        grace_s: float | None = None
        entries = environ.split(b"\0")
        if node_entry is not None and node_entry not in entries:
            continue
        for entry in entries:
            if entry.startswith(marker):
                job_id = entry[len(marker) :].decode(errors="replace")
            elif entry.startswith(attempt_marker):
                with contextlib.suppress(ValueError):
                    attempt = int(entry[len(attempt_marker) :])
            elif entry.startswith(grace_marker):
                with contextlib.suppress(ValueError):
                    grace_s = max(0.0, float(entry[len(grace_marker) :]))
        if job_id is None:
            continue
        stat = _read_stat(pid, root)
        if stat is None or stat[0] in ("Z", "X"):
            continue
        found.append(
            LeftoverProcess(pid=pid, pgid=stat[1], job_id=job_id, attempt=attempt, grace_s=grace_s)
        )
    return found


def leftover_graces(leftovers: Sequence[LeftoverProcess], default_s: float) -> dict[int, float]:
    """Each leftover process group with the grace period its job asked for (else
    ``default_s``), for :func:`kill_process_groups`."""
    graces: dict[int, float] = {}
    for leftover in leftovers:
        grace = default_s if leftover.grace_s is None else leftover.grace_s
        graces[leftover.pgid] = max(graces.get(leftover.pgid, 0.0), grace)
    return graces


def kill_process_groups(graces: Mapping[int, float], *, poll_s: float = 0.05) -> bool:
    """SIGTERM every group in ``graces`` (pgid: grace period) at once, SIGKILL each one
    still alive when its own grace is over. All at once: one after the other, the last
    job would wait for the sum of the others' graces before it could even checkpoint.
    Returns True when no live process is left in any of them."""
    for pgid in graces:
        if pgid <= 1 or pgid == os.getpgrp():
            # Never signal init's group or our own (that would kill the agent).
            raise ValueError(f"refusing to kill process group {pgid}")
    start = time.monotonic()
    for pgid in graces:
        _signal_group(pgid, signal.SIGTERM)
    alive = set(graces)
    killed: set[int] = set()
    while alive:
        now = time.monotonic()
        for pgid in sorted(alive):
            if not process_group_alive(pgid):
                alive.discard(pgid)
            elif pgid in killed:
                if now >= start + graces[pgid] + _KILL_WAIT_S:
                    return False  # SIGKILL did not take (uninterruptible sleep)
            elif now >= start + graces[pgid]:
                _signal_group(pgid, signal.SIGKILL)
                killed.add(pgid)
        if alive:
            time.sleep(poll_s)
    return True
