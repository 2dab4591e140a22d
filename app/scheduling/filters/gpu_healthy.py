"""GPU filter: the GPU reports healthy (no XID errors, ECC failures, fallen off the bus).

A job placed on a sick GPU fails and wastes its whole queue wait.
"""

from __future__ import annotations

from app.scheduling.status import OK, Context, Status, unschedulable
from app.scheduling.types import GpuView, NodeView, ReasonKind


def check(node: NodeView, gpu: GpuView, ctx: Context) -> Status:
    if gpu.healthy:
        return OK
    return unschedulable(ReasonKind.GPU_UNHEALTHY, f"node {node.name} gpu {gpu.index} unhealthy")
