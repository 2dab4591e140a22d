"""Simulated GPUs with the same interface as NVML, for laptops, the demo and tests.

Readings follow the jobs the agent attaches (so the dashboard and the
scheduler's "really free" check see load where jobs run), plus test hooks
to inject what real clusters do to us: processes started outside the
scheduler ("foreign" processes) and GPUs falling off the bus.

Injected state can live in a small JSON file (``state_file``) that is re-read
at every ``sample()``, so an end-to-end test can change what a *running*
agent process sees by writing that file (see :func:`save_sim_state`).
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import tempfile
import time
import uuid
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from workers.agent.gpu_backend import (
    GpuProcess,
    GpuSample,
    GpuStatic,
    NodeInfo,
    NodeSample,
    model_memory_mb,
)

logger = logging.getLogger(__name__)

DEFAULT_FAILURE_MESSAGE = "GPU has fallen off the bus"

# (idle watts, board power limit) per model family; unknown models look like H100.
_POWER_PROFILE: dict[str, tuple[float, float]] = {
    "H100": (70.0, 700.0),
    "A100": (55.0, 400.0),
    "V100": (40.0, 300.0),
    "L4": (16.0, 72.0),
}
# Families that are NVLink/NVSwitch parts in their usual (SXM) form; the rest are PCIe.
_NVLINK_FAMILIES = ("H100", "A100", "V100")

_IDLE_TEMPERATURE_C = 30.0
_FULL_LOAD_TEMPERATURE_C = 75.0
# Roughly what a training job keeps the SMs at; leaves room for noise and sharing.
_JOB_UTIL_PCT = 90.0
# A job that does not say how much memory it uses is assumed to use 60% of its share.
_DEFAULT_MEMORY_FRACTION = 0.6
# Synthetic pids for jobs attached by key are above Linux's maximum pid_max
# (2**22), so they can never be mistaken for a real process.
_SYNTHETIC_PID_BASE = 4_200_000


@dataclass(frozen=True)
class ForeignProcess:
    pid: int
    util_pct: float
    memory_mb: int


@dataclass
class SimInjectedState:
    """What tests inject: foreign processes and failed GPUs, by GPU index."""

    foreign: dict[int, list[ForeignProcess]] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "foreign": {
                str(index): [
                    {"pid": p.pid, "util_pct": p.util_pct, "memory_mb": p.memory_mb} for p in procs
                ]
                for index, procs in sorted(self.foreign.items())
                if procs
            },
            "failed": {str(index): message for index, message in sorted(self.failed.items())},
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> SimInjectedState:
        foreign_raw = data.get("foreign") or {}
        failed_raw = data.get("failed") or {}
        if not isinstance(foreign_raw, dict) or not isinstance(failed_raw, dict):
            raise ValueError("'foreign' and 'failed' must be objects keyed by GPU index")
        foreign = {
            int(index): [
                ForeignProcess(
                    pid=int(p["pid"]),
                    util_pct=float(p.get("util_pct", 0.0)),
                    memory_mb=int(p.get("memory_mb", 0)),
                )
                for p in procs
            ]
            for index, procs in foreign_raw.items()
        }
        failed = {int(index): str(message) for index, message in failed_raw.items()}
        return cls(foreign=foreign, failed=failed)


def load_sim_state(path: str | Path) -> SimInjectedState:
    """Read an injected-state file; a missing file means nothing injected."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return SimInjectedState()
    return SimInjectedState.from_json(json.loads(text))


def save_sim_state(path: str | Path, state: SimInjectedState) -> None:
    """Write atomically (temp file + rename) so a reader never sees half a file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as tmp:
            json.dump(state.to_json(), tmp, indent=2, sort_keys=True)
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class _SimJob:
    pid: int
    gpu_indices: tuple[int, ...]
    share: float
    memory_mb: int | None


def _family(model: str) -> str:
    upper = model.upper()
    for family in _POWER_PROFILE:
        if upper.startswith(family):
            return family
    return "H100"


class SimulatedGpus:
    """A :class:`~workers.agent.gpu_backend.GpuBackend` over simulated GPUs.

    Deterministic for a seed: the same calls in the same order give the same
    readings (UUIDs depend on hostname, seed and index).
    """

    def __init__(
        self,
        count: int = 4,
        model: str = "H100-80GB",
        memory_mb: int | None = None,
        seed: int = 0,
        *,
        state_file: str | Path | None = None,
        hostname: str | None = None,
        driver_version: str = "sim",
        clock: Callable[[], float] = time.time,
    ) -> None:
        if count < 0:
            raise ValueError("GPU count must be >= 0")
        self.count = count
        self.model = model
        self.memory_mb = memory_mb if memory_mb is not None else model_memory_mb(model)
        self.seed = seed
        self.state_file = Path(state_file) if state_file is not None else None
        self._clock = clock
        self._noise = random.Random(seed)
        self._jobs: dict[int | str, _SimJob] = {}
        self._injected = SimInjectedState()
        self._idle_w, self._tdp_w = _POWER_PROFILE[_family(model)]
        host = hostname or socket.gethostname()
        nvlink = model.upper().startswith(_NVLINK_FAMILIES)
        gpus = []
        for index in range(count):
            gpu_uuid = uuid.uuid5(uuid.NAMESPACE_URL, f"gpusched-sim://{host}/{seed}/{index}")
            # NVSwitch-style all-to-all for NVLink families, none for PCIe parts.
            peers = tuple(i for i in range(count) if i != index) if nvlink else ()
            gpus.append(
                GpuStatic(
                    index=index,
                    uuid=f"GPU-{gpu_uuid}",
                    model=model,
                    memory_total_mb=self.memory_mb,
                    nvlink_peers=peers,
                )
            )
        self._info = NodeInfo(
            hostname=host, driver_version=driver_version, gpus=tuple(gpus), backend="sim"
        )
        if self.state_file is not None:
            self._reload_state()

    # -- GpuBackend ---------------------------------------------------------

    def node_info(self) -> NodeInfo:
        return self._info

    def sample(self) -> NodeSample:
        if self.state_file is not None:
            self._reload_state()
        taken_at = self._clock()
        return NodeSample(
            taken_at=taken_at, gpus=tuple(self._sample_gpu(gpu) for gpu in self._info.gpus)
        )

    def close(self) -> None:
        """Nothing to release; present for the interface."""

    # -- job load -----------------------------------------------------------

    def attach_job(
        self,
        pid_or_key: int | str,
        gpu_indices: Iterable[int],
        share: float = 1.0,
        memory_mb: int | None = None,
    ) -> None:
        """Make a job's load visible on ``gpu_indices``.

        ``share`` is the fraction of each GPU the job uses (1.0 = whole GPU);
        ``memory_mb`` is per GPU, default 60% of the share. An int key is the
        job's pid and appears in ``processes``; a str key gets a synthetic pid
        (:meth:`pid_for`)."""
        indices = tuple(gpu_indices)
        for index in indices:
            self._check_index(index)
        if not 0.0 < share <= 1.0:
            raise ValueError("share must be in (0, 1]")
        pid = pid_or_key if isinstance(pid_or_key, int) else self.pid_for(pid_or_key)
        self._jobs[pid_or_key] = _SimJob(pid, indices, share, memory_mb)

    def detach_job(self, pid_or_key: int | str) -> None:
        """Release a finished job's load; unknown keys are ignored (idempotent)."""
        self._jobs.pop(pid_or_key, None)

    @staticmethod
    def pid_for(key: str) -> int:
        """The synthetic pid shown for a job attached by a string key."""
        return _SYNTHETIC_PID_BASE + zlib.crc32(key.encode()) % 1_000_000

    # -- test hooks ---------------------------------------------------------

    def inject_foreign_process(
        self, index: int, util_pct: float, memory_mb: int, pid: int | None = None
    ) -> int:
        """Add a process the scheduler did not start; returns its pid."""
        self._check_index(index)
        self._edit_state()
        if pid is None:
            already = len(self._injected.foreign.get(index, []))
            pid = _SYNTHETIC_PID_BASE + 1_000_000 + index * 1000 + already
        self._injected.foreign.setdefault(index, []).append(
            ForeignProcess(pid=pid, util_pct=util_pct, memory_mb=memory_mb)
        )
        self._save_state()
        return pid

    def clear_foreign(self, index: int) -> None:
        self._check_index(index)
        self._edit_state()
        self._injected.foreign.pop(index, None)
        self._save_state()

    def fail_gpu(self, index: int, message: str = DEFAULT_FAILURE_MESSAGE) -> None:
        self._check_index(index)
        self._edit_state()
        self._injected.failed[index] = message
        self._save_state()

    def recover_gpu(self, index: int) -> None:
        self._check_index(index)
        self._edit_state()
        self._injected.failed.pop(index, None)
        self._save_state()

    # -- internals ----------------------------------------------------------

    def _check_index(self, index: int) -> None:
        if not 0 <= index < self.count:
            raise IndexError(f"GPU index {index} out of range 0..{self.count - 1}")

    def _edit_state(self) -> None:
        # Start from the file, so an edit here does not undo what another
        # process (or another SimulatedGpus on the same file) wrote.
        if self.state_file is not None:
            self._reload_state()

    def _save_state(self) -> None:
        if self.state_file is not None:
            save_sim_state(self.state_file, self._injected)

    def _reload_state(self) -> None:
        assert self.state_file is not None
        try:
            self._injected = load_sim_state(self.state_file)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Keep the last good state: a bad edit must not crash the agent.
            logger.warning("ignoring unreadable sim state file %s: %s", self.state_file, exc)

    def _sample_gpu(self, gpu: GpuStatic) -> GpuSample:
        # Draw noise for every GPU on every sample, so one GPU's state does not
        # shift the noise sequence of the others.
        util_noise = self._noise.uniform(-2.0, 2.0)
        power_noise = self._noise.uniform(-3.0, 3.0)
        failure = self._injected.failed.get(gpu.index)
        if failure is not None:
            # What NVML gives for a GPU that has fallen off the bus: no readings.
            return GpuSample(
                index=gpu.index,
                uuid=gpu.uuid,
                healthy=False,
                health_message=failure,
                util_sm_pct=None,
                util_mem_pct=None,
                memory_used_mb=None,
                memory_free_mb=None,
                temperature_c=None,
                power_w=None,
                processes=(),
            )
        processes: list[GpuProcess] = []
        util = 0.0
        used_mb = 0
        for job in self._jobs.values():
            if gpu.index not in job.gpu_indices:
                continue
            job_memory = (
                job.memory_mb
                if job.memory_mb is not None
                else int(gpu.memory_total_mb * _DEFAULT_MEMORY_FRACTION * job.share)
            )
            util += _JOB_UTIL_PCT * job.share
            used_mb += job_memory
            processes.append(GpuProcess(pid=job.pid, used_memory_mb=job_memory))
        for foreign in self._injected.foreign.get(gpu.index, []):
            util += foreign.util_pct
            used_mb += foreign.memory_mb
            processes.append(GpuProcess(pid=foreign.pid, used_memory_mb=foreign.memory_mb))
        if util > 0:
            util = min(100.0, max(0.0, util + util_noise))
        used_mb = min(used_mb, gpu.memory_total_mb)
        load = util / 100.0
        power = self._idle_w + (self._tdp_w - self._idle_w) * load
        if util > 0:
            power = min(self._tdp_w, max(self._idle_w, power + power_noise))
        heat = (power - self._idle_w) / (self._tdp_w - self._idle_w)
        temperature = _IDLE_TEMPERATURE_C + (_FULL_LOAD_TEMPERATURE_C - _IDLE_TEMPERATURE_C) * heat
        return GpuSample(
            index=gpu.index,
            uuid=gpu.uuid,
            healthy=True,
            health_message=None,
            util_sm_pct=round(util, 1),
            # Training kernels keep memory bandwidth busy a little less than the SMs.
            util_mem_pct=round(util * 0.6, 1),
            memory_used_mb=used_mb,
            memory_free_mb=gpu.memory_total_mb - used_mb,
            temperature_c=round(temperature, 1),
            power_w=round(power, 1),
            processes=tuple(processes),
        )
