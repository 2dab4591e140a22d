"""Job x GPU filter: the GPU has the requested memory free.

`fits` is the one memory test of the scheduler: placement passes a GPU's free memory
now, the victim search and the backfill reservation what it would have free once
running jobs stop, and their first cut (and the explanation's) its total memory
("could it ever hold the job"). Free memory comes from telemetry (total - used), also
lowered by what our shared jobs have booked, so a process that grabbed memory outside
the scheduler is respected even when bookkeeping says the GPU is empty. `never` tells
a job that asks for more memory than any GPU of its model has.
"""

from __future__ import annotations

from app.scheduling.filters import gpu_model
from app.scheduling.state import HardwareClass, Request
from app.scheduling.status import OK, Status, unresolvable
from app.scheduling.types import ReasonKind


def fits(memory_mb: int, free_mb: int) -> bool:
    """Whether `free_mb` MB of GPU memory hold `memory_mb` (a job's `Request.memory_mb`)."""
    return free_mb >= memory_mb


def never(req: Request, hardware: tuple[HardwareClass, ...]) -> Status:
    if req.memory_mb <= 0 or req.gpus == 0:
        return OK
    largest = max(
        (mem for hc in hardware for model, mem in hc.gpus if gpu_model.fits(req.model, model)),
        default=0,
    )
    if fits(req.memory_mb, largest):
        return OK
    return unresolvable(
        ReasonKind.NEVER_FITS,
        f"no GPU could ever fit: needs {req.memory_mb} MB, largest GPU has {largest} MB",
    )
