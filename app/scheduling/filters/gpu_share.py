"""Job x GPU filter: the GPU has room for the job's share.

Shares are integer milli-GPUs so sums are exact: shared jobs fit together while
their shares add up to at most 1000; a whole-GPU job (1000) needs a GPU with
nothing of ours on it, and nothing shared is ever added next to it.
"""

from __future__ import annotations

from app.scheduling.state import Request, Slot


def fits(req: Request, slot: Slot) -> bool:
    return slot.free_milli >= req.milli
