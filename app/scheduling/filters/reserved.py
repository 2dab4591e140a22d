"""Job x GPU filter: the GPU is not held by the backfill reservation for another job.

The first job that cannot start holds GPUs (backfill.py); only it, and jobs that end
before it starts, may use them. `fits` is the one test of that: `holder` is the job
whose held GPUs the caller may use (None: none), and a cycle holds GPUs for one job.
"""

from __future__ import annotations


def fits(reserved_for: int | None, holder: int | None) -> bool:
    """Whether a GPU held for `reserved_for` (None: not held) is free to `holder`."""
    return reserved_for is None or reserved_for == holder
