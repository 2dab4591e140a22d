"""The node agent: registers the node, samples its GPUs, runs the jobs it is sent.

It talks to the rest of the system only through Celery messages (app.wire): it consumes
`node.<name>` (run_job, stop_job, set_time_limit) and sends reports (register,
heartbeat, started, finished, leaving; a job that ends within _FOLD_START_S is reported
by "finished" alone). Every report names (job_id, attempt) so the scheduler can ignore
stale ones.

Each attempt runs in its own group of the node's fence (workers/agent/fence.py), named by
installation + node + job + attempt: the agent finds its jobs' processes (for GPU
attribution, for stopping them, as leftovers after a restart) by that group alone, and
runs each job as its owner's Unix account when it can (workers/agent/accounts.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.wire import (
    AttemptRef,
    Finished,
    GpuInfo,
    GpuProcessReading,
    GpuReading,
    Heartbeat,
    Isolation,
    JobResult,
    Leaving,
    Malformed,
    Register,
    Report,
    RunJob,
    SetTimeLimit,
    Started,
    StopJob,
    attempt_log_path,
    dump,
    parse,
)
from workers.agent import accounts
from workers.agent.accounts import Account, AccountUnusable
from workers.agent.fence import (
    Fence,
    GpuDevice,
    IsolationChoice,
    choose_fence,
    denied_devices,
    host_gpu_devices,
)
from workers.agent.gpu_backend import (
    READING_MEMORY,
    READING_MIG_MODE,
    READING_PROCESSES,
    READING_UTILISATION,
    UNREADABLE_UUID,
    GpuBackend,
    GpuSample,
    NodeInfo,
    NodeSample,
)
from workers.agent.runner import (
    JobLaunch,
    LaunchError,
    RunningProcess,
    TerminateReason,
    classify,
    start_job,
    stop_groups,
    stop_result,
)

log = logging.getLogger("gpusched.agent")
AGENT_VERSION = "0.1.0"
RECENT_S = 120.0
# How long a job's start report waits for its end: one that has ended by then is reported
# once (its end implies its start). Short against the submit -> RUNNING goal (0.15 s).
_FOLD_START_S = 0.01


class AgentSettings(BaseSettings):
    """GPUSCHED_AGENT_* : one agent per GPU node."""

    model_config = SettingsConfigDict(env_prefix="GPUSCHED_AGENT_", extra="ignore")

    name: str = Field(default_factory=socket.gethostname)
    gpus: str = "auto"
    sample_interval_s: float = Field(default=5.0, gt=0)
    # NVML health hysteresis: a GPU is called unhealthy after this many bad readings in a
    # row (an XID event at once), and healthy again after this many good ones.
    unhealthy_after: int = Field(default=3, ge=1)
    healthy_after: int = Field(default=12, ge=1)
    grace_s: float = Field(default=30.0, ge=0)
    # Single-user on a root agent: every job runs as this account, not as its owner's.
    run_as_user: str | None = None
    # Accounts with uid 0 that jobs may run as (comma-separated): none unless named.
    uid0_accounts: str = ""
    # The installation's id (its database's): names the fence's groups, so that two
    # installations on one host never touch each other's jobs. `gpusched up` sets it; an
    # agent that has none takes it from Redis, where the scheduler publishes it.
    installation: str = Field(default="", pattern=r"^[A-Za-z0-9_-]{0,64}$")
    isolation: IsolationChoice = "auto"
    labels: dict[str, str] = Field(default_factory=dict)
    sim_state_file: str | None = None
    address: str = ""
    # The node's key (0600, the agent user's own); default <data dir>/agents/<name>/node.key.
    key_file: Path | None = None
    # Serves this agent's counters (refused orders) for Prometheus; 0: none.
    metrics_port: int = Field(default=0, ge=0, le=65535)


def unknown_readings(gpu: GpuSample, *, has_foreign: bool) -> tuple[str, ...]:
    """The readings the scheduler would decide with that this GPU did not give, each
    "name: why": free memory and its processes always; its utilisation when a foreign
    process is there (it is how much that process loads the GPU). Empty on an unhealthy
    GPU, whose verdict says more. Non-empty: the GPU is unknown, which is not free."""
    if not gpu.healthy:
        return ()
    needed = [READING_MEMORY, READING_PROCESSES, READING_MIG_MODE]
    if has_foreign:
        needed.append(READING_UTILISATION)
    return tuple(f"{name}: {gpu.unread[name]}"[:240] for name in needed if name in gpu.unread)


def gpu_infos(info: NodeInfo) -> tuple[GpuInfo, ...]:
    """The node's GPUs as registration tells the scheduler (which keys them by UUID)."""
    return tuple(
        GpuInfo(
            index=g.index,
            uuid=g.uuid,
            model=g.model,
            memory_total_mb=g.memory_total_mb,
            nvlink_peers=tuple(g.nvlink_peers),
        )
        for g in info.gpus
    )


def registration(
    *,
    node: str,
    info: NodeInfo,
    address: str = "",
    labels: dict[str, str] | None = None,
    isolation: Isolation | None,
    jobs_run_as: str | None,
    grace_s: float,
    again: bool = False,
) -> Register:
    """What an agent says when it starts (or when the scheduler asks again: `again`): its
    node, GPUs, how its jobs are fenced and whose account they run as (None: each its
    owner's), its default grace period. The fleet simulator (bench/fleet.py) sends the
    same."""
    return Register(
        node=node,
        hostname=address or info.hostname,
        labels=dict(labels or {}),
        agent_version=AGENT_VERSION,
        backend=info.backend,
        isolation=isolation,
        jobs_run_as=jobs_run_as,
        grace_s=grace_s,
        message=f"driver {info.driver_version}",
        gpus=gpu_infos(info),
        again=again,
    )


def build_heartbeat(
    *,
    node: str,
    interval_s: float,
    sample: NodeSample,
    ours: Mapping[int, tuple[int, int]],
    running: tuple[AttemptRef, ...],
    recent: tuple[Finished, ...],
    taken_at: float,
    unusable_accounts: Mapping[str, str] | None = None,
) -> Heartbeat:
    """A heartbeat from a sample of the node's GPUs: each GPU process attributed to the
    attempt it belongs to (`ours`: pid -> (job, attempt)) or marked foreign.

    NVML has no per-process utilisation on most GPUs, so foreign utilisation is the
    GPU's utilisation when only foreign processes use it, and its memory-weighted part
    when our jobs share the GPU with them.
    """
    gpus = []
    for gpu in sample.gpus:
        processes = []
        foreign_mem = own_mem = 0
        for proc in gpu.processes:
            key = ours.get(proc.pid)
            memory = proc.used_memory_mb or 0
            processes.append(
                GpuProcessReading(
                    pid=proc.pid,
                    used_memory_mb=proc.used_memory_mb,
                    job_id=key[0] if key else None,
                )
            )
            if key:
                own_mem += memory
            else:
                foreign_mem += memory
        util = gpu.util_sm_pct or 0.0
        has_foreign = any(p.job_id is None for p in processes)
        if not has_foreign:
            foreign_util = 0.0
        elif own_mem == 0:
            foreign_util = util
        else:
            foreign_util = util * foreign_mem / max(1, foreign_mem + own_mem)
        gpus.append(
            GpuReading(
                index=gpu.index,
                uuid=gpu.uuid,
                healthy=gpu.healthy,
                health_message=gpu.health_message,
                unknown=unknown_readings(gpu, has_foreign=has_foreign),
                mig_enabled=gpu.mig_enabled,
                util_pct=gpu.util_sm_pct,
                memory_util_pct=gpu.util_mem_pct,
                memory_used_mb=gpu.memory_used_mb,
                temperature_c=gpu.temperature_c,
                power_w=gpu.power_w,
                processes=tuple(processes),
                foreign_util_pct=foreign_util,
                foreign_memory_mb=foreign_mem,
            )
        )
    return Heartbeat(
        node=node,
        interval_s=interval_s,
        gpus=tuple(gpus),
        running=running,
        recent=recent,
        taken_at=taken_at,
        unusable_accounts=dict(unusable_accounts or {}),
    )


class Reporter(Protocol):
    def report(self, message: Report) -> bool: ...


@dataclass
class _Attempt:
    process: RunningProcess
    gpu_indices: tuple[int, ...]


class AgentCannotStart(RuntimeError):
    """The agent cannot do its work on this host (the message says why and what to do)."""


class Agent:
    def __init__(
        self,
        *,
        settings: AgentSettings,
        backend: GpuBackend,
        reporter: Reporter,
        log_dir: Path,
        log_cap_bytes: int,
        state_dir: Path,
        fence: Fence | None = None,
        gpu_devices: tuple[GpuDevice, ...] | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.reporter = reporter
        self.log_dir = log_dir
        self.log_cap_bytes = log_cap_bytes
        if fence is None:
            if not settings.installation:
                raise AgentCannotStart("no installation id (GPUSCHED_AGENT_INSTALLATION)")
            fence = choose_fence(settings.installation, settings.name, settings.isolation)
        self.fence = fence
        # The GPUs' device files on this host: a job may open only its own.
        self.gpu_devices = host_gpu_devices() if gpu_devices is None else gpu_devices
        self._uid0_allowed = accounts.parse_names(settings.uid0_accounts)
        # Per-user (None): each job runs as its owner's account. Else single-user: every
        # job runs as this account (the agent's own when it is not root).
        self.jobs_run_as: str | None = None
        self._single_account: Account | None = None
        if settings.run_as_user is not None:
            try:
                self._single_account = accounts.resolve(
                    settings.run_as_user, uid0_allowed=self._uid0_allowed
                )
            except AccountUnusable as exc:
                raise AgentCannotStart(f"GPUSCHED_AGENT_RUN_AS_USER: {exc}") from None
            self.jobs_run_as = settings.run_as_user
        elif os.geteuid() != 0:
            self.jobs_run_as = accounts.own_user()
        # Owners' accounts this node cannot run jobs as (account -> why), checked again at
        # every heartbeat; the scheduler places those owners' jobs elsewhere meanwhile.
        self._unusable: dict[str, str] = {}
        # One file per finished attempt while it is in `_recent`: an agent killed before its
        # report was applied repeats it after a restart, instead of the attempt being taken
        # for a lost process and run again.
        self.finished_dir = state_dir / "finished"
        # A run_job sent before this instant was meant for the agent this one replaced.
        self.started_at = time.time()
        self._lock = threading.Lock()
        self._running: dict[tuple[int, int], _Attempt] = {}
        # Attempts this agent has accepted (started or refused); a redelivered run_job for
        # one of them does nothing. Stops that arrive before their run_job land here too.
        self._seen: set[tuple[int, int]] = set()
        # Stops (reason, grace) for attempts not running yet: not started, or starting.
        self._stopped_early: dict[tuple[int, int], tuple[TerminateReason, float | None]] = {}
        # Time limits changed for attempts not running yet (a set_time_limit that overtook
        # its run_job): run_job starts them with it.
        self._limit_early: dict[tuple[int, int], float | None] = {}
        # Attempts that ended lately, with how they ended. Every heartbeat repeats them: a
        # "finished" report lost with Redis or while the database was down is then applied
        # from the next heartbeat, and their absence from "running" is never taken for a
        # lost process.
        self._recent: dict[tuple[int, int], tuple[float, Finished]] = {}
        self._stop = threading.Event()
        # Set by stop(): a run_job still delivered while the worker shuts down (Celery
        # finishes what it has fetched) starts nothing, or its job would outlive us.
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._watchdog_lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        self._kill_leftovers()
        self.replay_finished()
        self._start_watchdog()
        self._register()
        self._thread = threading.Thread(target=self._telemetry_loop, name="telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Shut down: running attempts get SIGTERM and the grace period, and are reported
        PREEMPTED so they requeue without spending a retry."""
        with self._lock:
            self._stopping = True
            attempts = list(self._running.values())
        for attempt in attempts:
            attempt.process.terminate("preempt", wait=False)
        # Each attempt has its own grace period; they all started it just now.
        deadline = (
            time.monotonic() + 5 + max((a.process.spec.grace_s for a in attempts), default=0.0)
        )
        for attempt in attempts:
            attempt.process.wait(max(0.0, deadline - time.monotonic()))
        settled = time.monotonic() + 2  # each exit is recorded by its own thread
        while self.running_count() and time.monotonic() < settled:
            time.sleep(0.02)
        self._stop.set()
        with self._watchdog_lock:
            if self._watchdog is not None and self._watchdog.stdin is not None:
                with contextlib.suppress(OSError):
                    self._watchdog.stdin.close()  # nothing left to kill: it exits
        if self._watchdog is not None:
            self._watchdog.wait(timeout=10)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._leave()
        self.backend.close()

    def _leave(self) -> None:
        """Tell the scheduler the node takes no more jobs from now (not only after its
        heartbeat timeout), with the outcome of its last attempts: reports may be handled
        out of order, and none must be judged before its own arrives."""
        with self._lock:
            recent = tuple(report for _, report in self._recent.values())
        self.reporter.report(Leaving(node=self.settings.name, recent=recent, taken_at=time.time()))

    def _start_watchdog(self) -> None:
        """A process that outlives us by design: when we die, it stops our jobs."""
        self._watchdog = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "workers.agent.watchdog",
                self.fence.installation,
                self.settings.name,
                self.fence.isolation,
                str(self.settings.grace_s),
            ],
            stdin=subprocess.PIPE,
            start_new_session=True,  # Ctrl-C and group signals aimed at us must not reach it
        )

    def _tell_watchdog(self, line: str) -> None:
        """Each attempt's start (with its grace period) and end, for the watchdog."""
        with self._watchdog_lock:
            pipe = self._watchdog.stdin if self._watchdog is not None else None
            if pipe is None or pipe.closed:
                return
            try:
                pipe.write(line.encode() + b"\n")
                pipe.flush()
            except OSError as exc:  # it died: a restarted agent still ends our leftovers
                log.warning("watchdog unreachable: %s", exc)

    def _kill_leftovers(self) -> None:
        """Attempts of ours that outlived a previous agent (their groups in the fence)
        cannot be supervised (their exit code would be lost): end them and report them
        lost, so they requeue, before this agent says it is ready."""
        leftovers = self.fence.find()
        for group in leftovers:
            log.warning(
                "ending leftover job %s attempt %s (%d processes)",
                group.key.job_id,
                group.key.attempt,
                len(group.pids()),
            )
        stop_groups([(group, self.settings.grace_s) for group in leftovers])
        for group in leftovers:
            group.remove()
            self.reporter.report(
                Finished(
                    node=self.settings.name,
                    job_id=int(group.key.job_id),
                    attempt=int(group.key.attempt),
                    result="LOST",
                    message="agent restarted; the attempt's leftover processes were ended",
                )
            )

    def replay_finished(self) -> None:
        """Report again the attempts a previous agent finished lately (from their files) and
        repeat them in heartbeats; a run_job redelivered for one of them does nothing."""
        for path in sorted(self.finished_dir.glob("*.json")):
            try:
                report = parse(Finished, path.read_text())
                key = (report.job_id, report.attempt)
            except (OSError, Malformed) as exc:
                log.warning("dropping unreadable finished record %s: %s", path, exc)
                path.unlink(missing_ok=True)
                continue
            log.info("job %s attempt %s finished before the restart: reporting again", *key)
            with self._lock:
                self._seen.add(key)
                self._recent[key] = (time.monotonic(), report)
            self.reporter.report(report)

    def _finished_path(self, key: tuple[int, int]) -> Path:
        return self.finished_dir / f"{key[0]}-{key[1]}.json"

    def _record_finished(self, key: tuple[int, int], report: Finished) -> None:
        path = self._finished_path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".tmp")
            partial.write_text(dump(report))
            partial.replace(path)  # atomic: a restart never reads half a record
        except OSError as exc:  # a full disk must not stop the report itself
            log.warning("could not record job %s attempt %s: %s", key[0], key[1], exc)

    def register_again(self) -> str:
        """The scheduler does not know this node (its Register was lost): say it again."""
        self._register(again=True)
        return "registered again"

    def _register(self, *, again: bool = False) -> None:
        self.reporter.report(
            registration(
                node=self.settings.name,
                info=self.backend.node_info(),
                address=self.settings.address,
                labels=self.settings.labels,
                isolation=self.fence.isolation,
                jobs_run_as=self.jobs_run_as,
                grace_s=self.settings.grace_s,
                again=again,
            )
        )

    def _telemetry_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.reporter.report(self.heartbeat(self.backend.sample()))
            except Exception:  # a sampling bug must not kill the agent; it is logged
                log.exception("telemetry sample failed")
            self._stop.wait(self.settings.sample_interval_s)

    # -- telemetry -------------------------------------------------------------------

    def heartbeat(self, sample: NodeSample) -> Heartbeat:
        """Readings per GPU, with each GPU process attributed to our job or marked foreign
        (build_heartbeat), and the attempts running and lately finished."""
        with self._lock:
            taken_at = time.time()  # when these lists were true (see heartbeat_taken_at)
            attempts = list(self._running.items())
            running = tuple(AttemptRef(job_id=k[0], attempt=k[1]) for k in self._running)
            horizon = time.monotonic() - RECENT_S
            expired = [k for k, v in self._recent.items() if v[0] < horizon]
            for done in expired:
                del self._recent[done]
            recent = tuple(report for _, report in self._recent.values())
        for done in expired:
            self._finished_path(done).unlink(missing_ok=True)
        # A GPU process is ours when it is in one of our attempts' groups, whatever session
        # or process group it made for itself (torchrun's workers).
        ours = {pid: key for key, a in attempts for pid in a.process.pids() | {a.process.pid}}
        return build_heartbeat(
            node=self.settings.name,
            interval_s=self.settings.sample_interval_s,
            sample=sample,
            ours=ours,
            running=running,
            recent=recent,
            taken_at=taken_at,
            unusable_accounts=self._check_unusable(),
        )

    def _check_unusable(self) -> dict[str, str]:
        """The owners' accounts this node still cannot run jobs as (account -> why): one
        created since (useradd) is usable again."""
        with self._lock:
            names = list(self._unusable)
        still = {}
        for name in names:
            try:
                accounts.resolve(name, uid0_allowed=self._uid0_allowed)
            except AccountUnusable as exc:
                still[name] = exc.reason
        with self._lock:
            for name in names:
                if name not in still:
                    self._unusable.pop(name, None)
        return still

    def _account(self, order: RunJob) -> Account | None:
        """The account this run order's job runs as (None: the agent's own); raises
        AccountUnusable when its owner's cannot be used here."""
        if self.jobs_run_as is not None:
            return self._single_account
        name = order.unix_user
        if not name:
            raise LaunchError("the run order names no unix account")
        try:
            return accounts.resolve(name, uid0_allowed=self._uid0_allowed)
        except AccountUnusable as exc:
            with self._lock:
                self._unusable[name] = exc.reason
            raise

    def gpu_uuids(self, gpu_indices: tuple[int, ...]) -> tuple[str, ...]:
        """NVML's UUIDs of these GPUs, for CUDA_VISIBLE_DEVICES; empty (by index) unless
        every one is a real GPU's: simulated GPUs have no CUDA device, and a GPU unreadable
        at start-up has only a placeholder."""
        if not gpu_indices or self.backend is None:
            return ()
        info = self.backend.node_info()
        if info.backend != "nvml":
            return ()
        by_index = {gpu.index: gpu.uuid for gpu in info.gpus}
        uuids = tuple(by_index.get(index, "") for index in gpu_indices)
        real = all(u.startswith("GPU-") and not u.startswith(UNREADABLE_UUID) for u in uuids)
        return uuids if real else ()

    def denied_devices(self, gpu_indices: tuple[int, ...]) -> tuple[GpuDevice, ...]:
        """The GPU device files a job on `gpu_indices` may not open: every other GPU's."""
        if not self.gpu_devices:
            return ()
        minors = {g.index: g.device_minor for g in self.backend.node_info().gpus}
        return denied_devices(
            self.gpu_devices, [m for i in gpu_indices if (m := minors.get(i)) is not None]
        )

    # -- jobs ------------------------------------------------------------------------

    def run_job(self, order: RunJob, *, sent_at: float) -> str:
        key = (order.job_id, order.attempt)
        if sent_at < self.started_at:
            # Queued for the agent before this one: while that agent was down, the node may
            # have been declared lost and the attempt requeued elsewhere. Reconciliation
            # sends it again if it is still this node's to run.
            log.warning("job %s attempt %s: run_job sent before this agent started; ignored", *key)
            return "stale"
        with self._lock:
            if key in self._seen:
                return "duplicate"  # a redelivered message for an attempt we already took
            self._seen.add(key)
            early = self._stopped_early.pop(key, None)
            stopping = self._stopping
            limit = self._limit_early.pop(key, order.max_runtime_s)
        if early is None and stopping:  # back to the queue, for another node or our restart
            self._finished(key, "PREEMPTED", None, "not started: the node's agent is stopping")
            return "stopping"
        if early is not None:
            # As if it had run and been stopped: a preempted or requeued attempt goes back
            # to the queue, a cancelled one ends.
            result = stop_result(early[0]) or "CANCELLED"
            self._finished(key, result, None, f"stopped before it started ({early[0]})")
            return "stopped"
        try:
            account = self._account(order)
        except LaunchError as exc:
            self._finished(key, "FAILED", None, f"could not start: {exc}")
            return "failed"
        except AccountUnusable as exc:
            # Not the job's failure: it goes back to the queue, and the scheduler, told by
            # this report and our heartbeats, places its owner's jobs elsewhere.
            message = f"not started: no usable unix account {exc.name!r} on node "
            self._finished(
                key,
                "REFUSED",
                None,
                f"{message}{self.settings.name} ({exc.reason})",
                account=exc.name,
                account_reason=exc.reason,
            )
            return "refused"
        launch = JobLaunch(
            command=order.command,
            script=order.script,
            workdir=order.workdir or tempfile.gettempdir(),
            job_id=key[0],
            attempt=key[1],
            log_path=attempt_log_path(self.log_dir, *key, order.node_rank),
            gpu_indices=order.gpu_indices,
            gpu_uuids=self.gpu_uuids(order.gpu_indices),
            env=order.env,
            log_cap_bytes=self.log_cap_bytes,
            max_runtime_s=limit,
            grace_s=self.settings.grace_s if order.grace_s is None else float(order.grace_s),
            account=account,
            master_addr=order.master_addr,
            master_port=order.master_port,
            world_size=order.world_size,
            node_rank=order.node_rank,
            nproc_per_node=order.nproc_per_node,
            node=self.settings.name,
        )
        self._tell_watchdog(f"start {key[0]} {key[1]} {launch.grace_s:g}")
        try:
            process = start_job(
                launch, fence=self.fence, denied_devices=self.denied_devices(launch.gpu_indices)
            )
        except LaunchError as exc:
            self._tell_watchdog(f"end {key[0]} {key[1]}")
            self._finished(key, "FAILED", None, f"could not start: {exc}")
            return "failed"
        attach = getattr(self.backend, "attach_job", None)
        if attach is not None and launch.gpu_indices:
            attach(
                process.pid, launch.gpu_indices, share=order.share, memory_mb=order.gpu_memory_mb
            )
        with self._lock:
            self._running[key] = _Attempt(process=process, gpu_indices=launch.gpu_indices)
            late = self._stopped_early.pop(key, None)  # a stop that came while it started
            limit_changed = key in self._limit_early  # a new limit that came meanwhile
            new_limit = self._limit_early.pop(key, None)
            if late is None and self._stopping:
                late = ("preempt", None)  # the agent began stopping while it started
        if limit_changed:
            process.set_time_limit(new_limit)
        if late is not None:
            process.terminate(late[0], grace_s=late[1], wait=False)
        log.info(
            "started job %s attempt %s on GPUs %s as pid %d",
            key[0],
            key[1],
            ",".join(map(str, launch.gpu_indices)) or "-",
            process.pid,
            extra={"job_id": key[0], "attempt": key[1], "node": self.settings.name},
        )
        threading.Thread(
            target=self._await_exit, args=(key, process), name=f"job-{key[0]}", daemon=True
        ).start()
        return "started"

    def stop_job(self, order: StopJob) -> str:
        key = (order.job_id, order.attempt)
        reason: TerminateReason = order.reason
        # A stop may carry a shorter grace than the job's (cancel --grace 0: kill now).
        grace = None if order.grace_s is None else float(order.grace_s)
        with self._lock:
            attempt = self._running.get(key)
            if attempt is None:
                if key in self._recent:
                    return "not running"  # it has ended already
                # Not started yet, or starting now: run_job applies the stop.
                self._stopped_early[key] = (reason, grace)
                return "remembered"
        attempt.process.terminate(reason, grace_s=grace, wait=False)
        return "terminating"

    def set_time_limit(self, order: SetTimeLimit) -> str:
        """Move a running attempt's time limit (`max_runtime_s` from its start, null: none),
        as `scontrol update TimeLimit=`; one not started yet gets it when it starts."""
        key = (order.job_id, order.attempt)
        limit = None if order.max_runtime_s is None else float(order.max_runtime_s)
        with self._lock:
            attempt = self._running.get(key)
            if attempt is None:
                if key in self._recent:
                    return "not running"  # it has ended (or was refused)
                # Not started yet, or starting now: run_job applies it.
                self._limit_early[key] = limit
                return "remembered"
        attempt.process.set_time_limit(limit)
        log.info(
            "job %s attempt %s: time limit now %s",
            *key,
            "none" if limit is None else f"{limit:g}s",
            extra={"job_id": key[0], "attempt": key[1], "node": self.settings.name},
        )
        return "changed"

    def _await_exit(self, key: tuple[int, int], process: RunningProcess) -> None:
        # A job that ends at once is reported once, by its end (which implies its start):
        # a queue of short jobs costs the scheduler one report per job, not two.
        outcome = process.wait(_FOLD_START_S)
        if outcome is None:
            self.reporter.report(
                Started(node=self.settings.name, job_id=key[0], attempt=key[1], pid=process.pid)
            )
            outcome = process.wait()
        assert outcome is not None
        detach = getattr(self.backend, "detach_job", None)
        if detach is not None:
            detach(process.pid)
        self._tell_watchdog(f"end {key[0]} {key[1]}")
        self._finished(
            key,
            classify(outcome),
            outcome.exit_code,
            outcome.describe(),
            pid=process.pid,
            cpu_s=outcome.usage.cpu_s,
            memory_peak_mb=outcome.usage.memory_peak_mb,
        )

    def _finished(
        self,
        key: tuple[int, int],
        result: JobResult,
        exit_code: int | None,
        message: str,
        *,
        pid: int | None = None,
        cpu_s: float | None = None,
        memory_peak_mb: int | None = None,
        account: str | None = None,
        account_reason: str | None = None,
    ) -> None:
        log.info(
            "job %s attempt %s %s: %s",
            key[0],
            key[1],
            result,
            message,
            extra={"job_id": key[0], "attempt": key[1], "node": self.settings.name},
        )
        report = Finished(
            node=self.settings.name,
            job_id=key[0],
            attempt=key[1],
            result=result,
            exit_code=exit_code,
            message=message,
            pid=pid,
            # What the attempt's processes used on this node (its group's CPU time and
            # peak memory), for seff; None: not measured.
            cpu_s=cpu_s,
            memory_peak_mb=memory_peak_mb,
            # REFUSED: the owner's account cannot be used here.
            account=account,
            account_reason=account_reason,
        )
        self._record_finished(key, report)
        with self._lock:
            # One step: a heartbeat must never see the attempt in neither list, or the
            # scheduler would take it for a process that vanished.
            self._running.pop(key, None)
            self._recent[key] = (time.monotonic(), report)
        self.reporter.report(report)

    def running_count(self) -> int:
        with self._lock:
            return len(self._running)
