"""The node agent's view of its GPUs: one small interface, two implementations.

The agent samples its GPUs every few seconds and reports the readings as
telemetry; the scheduler places jobs on GPUs that are *really* free, so the
readings must be honest, including "I could not read this" (``None``) and
"this GPU is broken" (``healthy=False``). Two backends implement the
interface: :mod:`workers.agent.nvml_backend` (real GPUs, the only module that
imports ``pynvml``) and :mod:`workers.agent.sim_backend` (simulated GPUs for
development, the demo and the tests).

Nothing here imports SQLAlchemy, Celery or ``app``: the agent worker calls
these edge pieces and turns their dataclasses into reports.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol, runtime_checkable

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuStatic:
    """Facts about one GPU that do not change while the agent runs."""

    index: int
    uuid: str
    model: str
    memory_total_mb: int
    # Indices of the GPUs on this node reachable over NVLink (directly or via
    # NVSwitch); empty when the GPU has no NVLink or NVML cannot tell.
    nvlink_peers: tuple[int, ...] = ()
    # N of its device file /dev/nvidiaN (NVML's minor number, not always its index): the
    # one a job on this GPU may open (workers/agent/fence.py); None: no device file.
    device_minor: int | None = None


@dataclass(frozen=True)
class NodeInfo:
    hostname: str
    driver_version: str | None
    gpus: tuple[GpuStatic, ...]
    # "nvml" or "sim": shown in the UI so nobody mistakes a demo for a cluster.
    backend: str = "nvml"


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    # None when the driver does not report per-process memory (e.g. no permission).
    used_memory_mb: int | None


# Names of the readings a backend may fail to give (GpuSample.unread): the ones the
# scheduler decides with, so one that fails leaves the GPU unknown, not free.
READING_MEMORY = "memory"
READING_UTILISATION = "utilisation"
READING_PROCESSES = "processes"
READING_MIG_MODE = "MIG mode"
# What a GPU unreadable at the agent's start is called instead of its UUID (and index).
UNREADABLE_UUID = "GPU-unreadable-"


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU. Any number may be None: the GPU does not support
    that query, or it is unhealthy and could not be read. ``unread`` says which of
    the deciding readings (READING_*) failed and why: "could not read" is not 0."""

    index: int
    uuid: str
    healthy: bool
    health_message: str | None
    util_sm_pct: float | None
    util_mem_pct: float | None
    memory_used_mb: int | None
    memory_free_mb: int | None
    temperature_c: float | None
    power_w: float | None
    processes: tuple[GpuProcess, ...] = ()
    unread: Mapping[str, str] = field(default_factory=dict)
    # MIG mode is on: the GPU is sliced, and the scheduler must not hand it out whole.
    mig_enabled: bool = False


@dataclass(frozen=True)
class NodeSample:
    # Unix time (seconds) at which the sample was taken, from the backend's clock.
    taken_at: float
    gpus: tuple[GpuSample, ...]


@runtime_checkable
class GpuBackend(Protocol):
    def node_info(self) -> NodeInfo:
        """Static facts; cheap to call repeatedly (implementations cache)."""
        ...

    def sample(self) -> NodeSample:
        """Current readings of every GPU in ``node_info().gpus`` order.

        Must never raise because of a GPU problem: problems become
        ``healthy=False`` with a message, or ``None`` fields."""
        ...

    def close(self) -> None:
        """Release the backend; safe to call more than once."""
        ...


class BackendUnavailable(RuntimeError):
    """The requested backend cannot be used on this machine (e.g. no NVML)."""


# MiB as NVML reports memory.total for each model (what nvidia-smi shows), so a
# simulated node offers exactly what a real one would.
KNOWN_MODEL_MEMORY_MB: dict[str, int] = {
    "H100-80GB": 81559,
    "A100-80GB": 81920,
    "A100-40GB": 40960,
    "V100-32GB": 32768,
    "L4": 23034,
}
DEFAULT_SIM_MODEL = "H100-80GB"
DEFAULT_SIM_GPU_COUNT = 4
DEFAULT_MEMORY_MB = KNOWN_MODEL_MEMORY_MB[DEFAULT_SIM_MODEL]

_MEMORY_SUFFIX = re.compile(r"(\d+)\s*GB$", re.IGNORECASE)


def model_memory_mb(model: str) -> int:
    """Memory of a GPU model in MiB: the known table first, then an ``NNGB``
    suffix (``RTX-24GB`` -> 24576), else the H100-80GB default."""
    if model in KNOWN_MODEL_MEMORY_MB:
        return KNOWN_MODEL_MEMORY_MB[model]
    match = _MEMORY_SUFFIX.search(model)
    if match:
        return int(match.group(1)) * 1024
    return DEFAULT_MEMORY_MB


class SimSpec(NamedTuple):
    """Parsed ``sim:[NODESx]GPUS[:MODEL]`` spec; a tuple so callers may unpack it."""

    nodes: int
    gpus_per_node: int
    model: str
    memory_mb: int


_SIM_SPEC = re.compile(r"^sim(?::(?:(?P<nodes>\d+)x)?(?P<gpus>\d+)(?::(?P<model>[^:]+))?)?$")


def parse_sim_spec(spec: str) -> SimSpec:
    """Parse ``sim``, ``sim:8``, ``sim:8:H100-80GB`` or ``sim:2x8:A100-40GB``.

    ``NxG`` means N simulated nodes of G GPUs each; the launcher starts one
    agent per node. Without it the spec describes one node."""
    match = _SIM_SPEC.match(spec.strip())
    if match is None:
        raise ValueError(
            f"bad simulated GPU spec {spec!r}: expected sim[:[NODESx]GPUS[:MODEL]], "
            "e.g. sim:8:H100-80GB or sim:2x8:A100-40GB"
        )
    nodes = int(match.group("nodes") or 1)
    gpus = int(match.group("gpus") or DEFAULT_SIM_GPU_COUNT)
    model = match.group("model") or DEFAULT_SIM_MODEL
    if nodes < 1 or gpus < 1:
        raise ValueError(f"bad simulated GPU spec {spec!r}: need at least one node and one GPU")
    return SimSpec(nodes=nodes, gpus_per_node=gpus, model=model, memory_mb=model_memory_mb(model))


def format_sim_spec(spec: SimSpec) -> str:
    if spec.nodes == 1:
        return f"sim:{spec.gpus_per_node}:{spec.model}"
    return f"sim:{spec.nodes}x{spec.gpus_per_node}:{spec.model}"


def open_backend(
    spec: str | None,
    *,
    hostname: str | None = None,
    seed: int = 0,
    sim_state_file: str | Path | None = None,
    nvml_module: object | None = None,
    unhealthy_after: int | None = None,
    healthy_after: int | None = None,
) -> tuple[GpuBackend, str]:
    """Open the GPU backend named by ``spec``; return it with a log line saying
    what was opened and, on a fallback, why.

    - ``None`` / ``"auto"``: NVML when it initialises and sees GPUs, else a
      simulated node of 4 H100s (so a laptop runs the whole stack).
    - ``"nvml"``: NVML or :class:`BackendUnavailable`; a GPU node must never
      silently pretend.
    - ``"sim:..."``: simulated GPUs (see :func:`parse_sim_spec`); a multi-node
      spec gives this agent one node's worth of GPUs.

    ``nvml_module`` replaces the ``pynvml`` module (tests pass a fake);
    ``unhealthy_after``/``healthy_after`` set NVML's health hysteresis (None: defaults).
    """
    host = hostname or socket.gethostname()
    normalized = (spec or "auto").strip()
    if normalized.lower() in ("auto", "nvml"):
        # Imported here so a simulated-only agent never loads the NVML bindings.
        from workers.agent.nvml_backend import HEALTHY_AFTER, UNHEALTHY_AFTER, NvmlGpuBackend

        module: dict[str, Any] = {} if nvml_module is None else {"nvml": nvml_module}
        try:
            nvml_backend = NvmlGpuBackend(
                **module,
                hostname=host,
                unhealthy_after=unhealthy_after or UNHEALTHY_AFTER,
                healthy_after=healthy_after or HEALTHY_AFTER,
            )
        except BackendUnavailable as exc:
            if normalized.lower() == "nvml":
                raise
            reason = str(exc)
        else:
            gpu_count = len(nvml_backend.node_info().gpus)
            if gpu_count > 0 or normalized.lower() == "nvml":
                info = nvml_backend.node_info()
                models = sorted({gpu.model for gpu in info.gpus})
                return nvml_backend, (
                    f"using NVML: {gpu_count} GPU(s) {', '.join(models) or '-'}, "
                    f"driver {info.driver_version}"
                )
            nvml_backend.close()
            reason = "NVML initialised but reports no GPUs"
        fallback = SimSpec(1, DEFAULT_SIM_GPU_COUNT, DEFAULT_SIM_MODEL, DEFAULT_MEMORY_MB)
        backend = _open_sim(fallback, host, seed, sim_state_file)
        return backend, (
            f"NVML unavailable ({reason}); using simulated GPUs {format_sim_spec(fallback)}"
        )

    if normalized.lower().startswith("sim"):
        parsed = parse_sim_spec(normalized)
        backend = _open_sim(parsed, host, seed, sim_state_file)
        per_node = SimSpec(1, parsed.gpus_per_node, parsed.model, parsed.memory_mb)
        line = f"using simulated GPUs {format_sim_spec(per_node)} ({parsed.memory_mb} MiB each)"
        if parsed.nodes > 1:
            line += f"; this agent is one node of {format_sim_spec(parsed)}"
        return backend, line

    raise ValueError(f"unknown GPU backend spec {spec!r}: use auto, nvml or sim:[NxG][:MODEL]")


def _open_sim(spec: SimSpec, hostname: str, seed: int, state_file: str | Path | None) -> GpuBackend:
    from workers.agent.sim_backend import SimulatedGpus

    return SimulatedGpus(
        count=spec.gpus_per_node,
        model=spec.model,
        memory_mb=spec.memory_mb,
        seed=seed,
        state_file=state_file,
        hostname=hostname,
    )
