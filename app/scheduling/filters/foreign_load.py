"""GPU filter: no foreign process is using the GPU, and that has held for a while.

GPUs on shared workstations are also used outside the scheduler. Utilisation by
processes that are not ours must be below the threshold, and must have stayed
below it for the stability window: a GPU that went idle a second ago is
probably between two steps of someone's notebook. Our own jobs' load is never
foreign (the caller reports it apart), so a GPU one of our jobs just started
on is not mistaken for a busy or freshly idle one.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from app.scheduling.status import OK, Context, Status, unschedulable
from app.scheduling.types import GpuView, NodeView, ReasonKind


def check(node: NodeView, gpu: GpuView, ctx: Context) -> Status:
    settings = ctx.settings
    if gpu.foreign_util_pct >= settings.foreign_util_threshold_pct:
        return unschedulable(
            ReasonKind.FOREIGN_PROCESS,
            f"GPU busy with foreign process on node {node.name} gpu {gpu.index}"
            f" ({gpu.foreign_util_pct:.0f}% util)",
        )
    idle = gpu.idle_since
    if idle is None:
        return unschedulable(
            ReasonKind.FOREIGN_PROCESS,
            f"GPU not yet seen idle of foreign processes on node {node.name} gpu {gpu.index}",
        )
    idle_s = (ctx.now - idle).total_seconds()
    if idle_s < settings.stability_window_s:
        return unschedulable(
            ReasonKind.FOREIGN_PROCESS,
            f"GPU on node {node.name} gpu {gpu.index} free of foreign processes for only "
            f"{idle_s:.0f}s (need {settings.stability_window_s:.0f}s)",
        )
    return OK


def idle_before(ctx: Context) -> datetime | None:
    """Precheck bound: a GPU below the foreign-load threshold and idle since at or
    before this instant surely passes `check` (millisecond of slack against float
    rounding; anything else goes through `check`, which decides)."""
    try:
        return ctx.now - timedelta(seconds=ctx.settings.stability_window_s) - _MS
    except (OverflowError, ValueError):
        return None  # window not a representable time span (e.g. infinite): no bound


_MS = timedelta(milliseconds=1)
