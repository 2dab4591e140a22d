"""Feasibility checks, one pure function per module, run cheapest first.

The order is fixed here and nowhere else:

1. JOB_FILTERS (per job, no cluster state): begin time, off-peak window.
   A job that is not yet eligible never touches the cluster index.
2. NODE_FILTERS (once per node per cycle): ready/not drained, heartbeat fresh.
3. GPU_FILTERS (once per GPU per cycle): telemetry fresh, healthy, no foreign load
   (stable for the window). A GPU failing these is left out of the free index.
4. NEVER_FILTERS (once per job shape, cached): model exists, memory exists,
   enough GPUs per node / enough nodes. Separates "can never fit" from "not now".
5. SLOT_FILTERS (per job x candidate GPU while placing): model, free memory
   from telemetry, room for the share. enough_gpus.fits then counts per node.

Node and GPU filters also offer a precheck bound (`fresh_after`, `idle_before`):
the cycle compares a timestamp with it and runs the filters themselves only
when the bound cannot vouch for a node or GPU (nearly never on a healthy
cluster). A precheck can only say "surely passes", so the first failing
filter and its message are always the filter's own.
"""

from __future__ import annotations

from collections.abc import Callable

from app.scheduling.filters import (
    begin_time,
    enough_gpus,
    foreign_load,
    gpu_healthy,
    gpu_memory,
    gpu_model,
    gpu_share,
    heartbeat_fresh,
    node_ready,
    offpeak_window,
    telemetry_fresh,
)
from app.scheduling.state import HardwareClass, Request, Slot
from app.scheduling.status import Context, Status
from app.scheduling.types import GpuView, JobView, NodeView

JobFilter = Callable[[JobView, Context], Status]
NodeFilter = Callable[[NodeView, Context], Status]
GpuFilter = Callable[[NodeView, GpuView, Context], Status]
NeverFilter = Callable[[Request, tuple[HardwareClass, ...]], Status]
SlotFilter = Callable[[Request, Slot], bool]

JOB_FILTERS: tuple[JobFilter, ...] = (begin_time.check, offpeak_window.check)
NODE_FILTERS: tuple[NodeFilter, ...] = (node_ready.check, heartbeat_fresh.check)
GPU_FILTERS: tuple[GpuFilter, ...] = (
    telemetry_fresh.check,
    gpu_healthy.check,
    foreign_load.check,
)
NEVER_FILTERS: tuple[NeverFilter, ...] = (gpu_model.never, gpu_memory.never, enough_gpus.never)
SLOT_FILTERS: tuple[SlotFilter, ...] = (gpu_model.fits, gpu_memory.fits, gpu_share.fits)


def slot_fits(req: Request, slot: Slot) -> bool:
    """All SLOT_FILTERS, inlined: this runs in the placement hot loop."""
    return (
        slot.free_milli >= req.milli
        and slot.free_mem >= req.memory_mb
        and (req.model is None or slot.model == req.model)
    )


__all__ = [
    "GPU_FILTERS",
    "JOB_FILTERS",
    "NEVER_FILTERS",
    "NODE_FILTERS",
    "SLOT_FILTERS",
    "slot_fits",
]
