"""Node agent edge pieces: GPU backends (NVML / simulated), the job runner and the fence
around each job's processes.

These modules import no SQLAlchemy, Celery or ``app``; the Celery agent
worker calls them. ``pynvml`` is imported only by ``nvml_backend``.
"""

from workers.agent.fence import Fence, choose_fence
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
    Outcome,
    RunningProcess,
    classify,
    start_job,
    stop_groups,
)

__all__ = [
    "BackendUnavailable",
    "Fence",
    "GpuBackend",
    "GpuProcess",
    "GpuSample",
    "GpuStatic",
    "JobLaunch",
    "LaunchError",
    "NodeInfo",
    "NodeSample",
    "Outcome",
    "RunningProcess",
    "SimSpec",
    "choose_fence",
    "classify",
    "model_memory_mb",
    "open_backend",
    "parse_sim_spec",
    "start_job",
    "stop_groups",
]
