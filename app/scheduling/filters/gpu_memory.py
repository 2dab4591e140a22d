"""Job x GPU filter: the GPU has the requested memory free *now*.

Free memory comes from telemetry (total - used), also lowered by what our
shared jobs have booked, so a process that grabbed memory outside the scheduler
is respected even when bookkeeping says the GPU is empty. `never` tells a job
that asks for more memory than any GPU of its model has.
"""

from __future__ import annotations

from app.scheduling.state import HardwareClass, Request, Slot
from app.scheduling.status import OK, Status, unresolvable
from app.scheduling.types import ReasonKind


def fits(req: Request, slot: Slot) -> bool:
    return slot.free_mem >= req.memory_mb


def never(req: Request, hardware: tuple[HardwareClass, ...]) -> Status:
    if req.memory_mb <= 0 or req.gpus == 0:
        return OK
    largest = max(
        (mem for hc in hardware for model, mem in hc.gpus if req.model in (None, model)),
        default=0,
    )
    if req.memory_mb <= largest:
        return OK
    return unresolvable(
        ReasonKind.NEVER_FITS,
        f"no GPU could ever fit: needs {req.memory_mb} MB, largest GPU has {largest} MB",
    )
