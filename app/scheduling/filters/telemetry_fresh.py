"""GPU filter: the GPU's telemetry sample is recent.

Placement trusts live NVML readings (free memory, foreign processes) over
bookkeeping; a stale reading could hide a process that grabbed the GPU.
Per GPU, once per cycle.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from app.scheduling.status import OK, Context, Status, unschedulable
from app.scheduling.types import GpuView, NodeView, ReasonKind


def check(node: NodeView, gpu: GpuView, ctx: Context) -> Status:
    at = gpu.telemetry_at
    if at is not None and (ctx.now - at).total_seconds() <= ctx.settings.telemetry_max_age_s:
        return OK
    return unschedulable(
        ReasonKind.TELEMETRY_STALE, f"telemetry stale on node {node.name} gpu {gpu.index}"
    )


def fresh_after(ctx: Context) -> datetime | None:
    """Precheck bound: telemetry at or after this instant surely passes `check`.

    One datetime comparison per GPU instead of a subtraction; the millisecond of
    slack keeps it on the safe side of float rounding, and anything older than
    the bound still goes through `check`, which decides.
    """
    try:
        return ctx.now - timedelta(seconds=ctx.settings.telemetry_max_age_s) + _MS
    except (OverflowError, ValueError):
        return None  # limit not a representable time span (e.g. infinite): no bound


_MS = timedelta(milliseconds=1)
