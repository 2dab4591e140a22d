"""Job x GPU filter: the GPU has room for the job's share.

Shares are integer milli-GPUs so sums are exact: shared jobs fit together while
their shares add up to at most 1000; a whole-GPU job (1000) needs a GPU with
nothing of ours on it, and nothing shared is ever added next to it. `fits` is the
one share test of the scheduler: placement passes a GPU's free share now, the victim
search and the backfill reservation what it would have free once running jobs stop.
"""

from __future__ import annotations


def fits(milli: int, free_milli: int) -> bool:
    """Whether `free_milli` thousandths of a GPU hold a share of `milli` (a job's
    `Request.milli`)."""
    return free_milli >= milli
