"""GPU filter: the GPU reports healthy (no XID errors, ECC failures, fallen off the bus),
its deciding readings were taken, and it is not sliced by MIG.

A job placed on a sick GPU fails and wastes its whole queue wait. A GPU whose memory or
processes could not be read (no permission, an NVML error) is unknown, and unknown is not
free: it may hold someone's job. A MIG-enabled GPU is sliced: handed out whole, its job
would get one slice's memory, or none (slices are not scheduled).
"""

from __future__ import annotations

from app.scheduling.status import OK, Context, Status, unschedulable
from app.scheduling.types import GpuView, NodeView, ReasonKind


def check(node: NodeView, gpu: GpuView, ctx: Context) -> Status:
    if gpu.healthy:
        return OK
    if gpu.mig_enabled:
        return unschedulable(
            ReasonKind.GPU_MIG,
            f"node {node.name} gpu {gpu.index} has MIG enabled: MIG slices are not scheduled",
        )
    if gpu.unknown:
        return unschedulable(
            ReasonKind.GPU_UNKNOWN,
            f"node {node.name} gpu {gpu.index} unknown: could not read {'; '.join(gpu.unknown)}",
        )
    return unschedulable(ReasonKind.GPU_UNHEALTHY, f"node {node.name} gpu {gpu.index} unhealthy")
