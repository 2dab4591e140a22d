"""Node agent edge pieces: GPU backends (NVML / simulated) and the job runner.

These modules import no SQLAlchemy, Celery or ``app``; the Celery agent
worker calls them. ``pynvml`` is imported only by ``nvml_backend``.
"""

from workers.agent.gpu_backend import (
    BackendUnavailable,
    GpuBackend,
    GpuProcess,
    GpuSample,
    GpuStatic,
    NodeInfo,
    NodeSample,
    SimSpec,
    model_memory_mb,
    open_backend,
    parse_sim_spec,
)
from workers.agent.runner import (
    JobLaunch,
    LaunchError,
    LeftoverProcess,
    Outcome,
    RunningProcess,
    classify,
    find_leftover_processes,
    kill_process_groups,
    start_job,
)

__all__ = [
    "BackendUnavailable",
    "GpuBackend",
    "GpuProcess",
    "GpuSample",
    "GpuStatic",
    "JobLaunch",
    "LaunchError",
    "LeftoverProcess",
    "NodeInfo",
    "NodeSample",
    "Outcome",
    "RunningProcess",
    "SimSpec",
    "classify",
    "find_leftover_processes",
    "kill_process_groups",
    "model_memory_mb",
    "open_backend",
    "parse_sim_spec",
    "start_job",
]
