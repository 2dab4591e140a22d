"""Feasibility checks, one pure function per module, run cheapest first.

The order is fixed here and nowhere else:

1. JOB_FILTERS (per job, no cluster state): begin time, off-peak window.
   A job that is not yet eligible never touches the cluster index.
2. NODE_FILTERS (once per node per cycle): ready/not drained, heartbeat fresh.
3. GPU_FILTERS (once per GPU per cycle): telemetry fresh, healthy, no foreign load
   (stable for the window). A GPU failing these is left out of the free index.
4. NEVER_FILTERS (once per job shape, cached): model exists, memory exists,
   enough GPUs per node / enough nodes. Separates "can never fit" from "not now".
5. Slot filters (per job x GPU while placing; `slot_fits` runs them on a usable GPU):
   gpu_share (room for the share), gpu_memory (free memory from telemetry),
   gpu_model, reserved (not held for another job). enough_gpus.fits then counts per
   node, enough_nodes.fits the nodes of a gang.
6. quota.fits (per job, against its project's use): within the quota, for the
   quota check without borrowing and for reclaiming borrowed GPUs.
7. running_limit.fits (per job, against what its user and its project run, jobs and
   GPUs, counting this cycle's placements): over a limit the job waits (RUNNING_LIMIT)
   before placement, so it neither places, preempts nor takes the backfill reservation.

Each of these modules holds its rule once: its `fits` is the one test that placement,
the victim search (preempt.py), the backfill reservation (backfill.py) and the
pending-reason ladder (explain.py) all call, each passing the quantity it asks about
(free now, free once running jobs stop, total). To change how a job's GPU memory is
checked, edit `gpu_memory.py`; nothing else repeats it.

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
    reserved,
    telemetry_fresh,
)
from app.scheduling.state import HardwareClass, Request, Slot
from app.scheduling.status import Context, Status
from app.scheduling.types import GpuView, JobView, NodeView

JobFilter = Callable[[JobView, Context], Status]
NodeFilter = Callable[[NodeView, Context], Status]
GpuFilter = Callable[[NodeView, GpuView, Context], Status]
NeverFilter = Callable[[Request, tuple[HardwareClass, ...]], Status]

JOB_FILTERS: tuple[JobFilter, ...] = (begin_time.check, offpeak_window.check)
NODE_FILTERS: tuple[NodeFilter, ...] = (node_ready.check, heartbeat_fresh.check)
GPU_FILTERS: tuple[GpuFilter, ...] = (
    telemetry_fresh.check,
    gpu_healthy.check,
    foreign_load.check,
)
NEVER_FILTERS: tuple[NeverFilter, ...] = (gpu_model.never, gpu_memory.never, enough_gpus.never)


def slot_fits(
    milli: int, memory_mb: int, model: str | None, slot: Slot, holder: int | None
) -> bool:
    """Whether a usable GPU takes a job of that share, memory and model (its `Request`'s
    fields, read once per call by the caller) now: each slot filter's `fits`, cheapest
    first. `holder`: the job whose reserved GPUs the caller may use (None: none)."""
    return (
        slot.blocker is None
        and gpu_share.fits(milli, slot.free_milli)
        and gpu_memory.fits(memory_mb, slot.free_mem)
        and gpu_model.fits(model, slot.model)
        and reserved.fits(slot.reserved_for, holder)
    )


__all__ = [
    "GPU_FILTERS",
    "JOB_FILTERS",
    "NEVER_FILTERS",
    "NODE_FILTERS",
    "slot_fits",
]
