"""Which waiting jobs' reasons differ from the ones stored.

A full cycle compares the reason of every waiting job with the one its row holds, to
write only what changed. In a deep queue that is 20,000 comparisons per cycle: as
interpreted Python the loop was a tenth of the cycle (bench/deep_queue.py), compiled with
the rest of the core it takes about half as long, most of it looking the rows up (memory
reads, not instructions). Pure: the rows are whatever the caller read.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar

from app.scheduling.types import PendingReason

# (job id, reason, message, queue key, estimated start): a row's new reason columns.
ReasonRow = tuple[int, str, str, int | None, datetime | None]


class StoredRow(Protocol):
    # (reason, message, queue key, estimated start) as the job's row holds them.
    reasons: tuple[Any, ...]


# The rows come as a dict (not a Mapping: the compiled lookup is then a plain dict
# lookup), of whatever type has `reasons`.
Row = TypeVar("Row", bound=StoredRow)


def changed_reasons(
    waiting: Sequence[PendingReason], stored: dict[int, Row], *, max_message: int
) -> list[ReasonRow]:
    """The reason columns to write for `waiting` (in queue order), where they differ
    from `stored`. A job ranked for the first time (no queue key stored) gets its place
    as its key; a key is never rewritten when the order changes (see
    `Job.queue_position`). Messages are cut to `max_message` characters, as stored."""
    changes: list[ReasonRow] = []
    place = 0
    for job_id, kind, message, _, start in waiting:
        place += 1
        read = stored.get(job_id)
        old = None if read is None else read.reasons
        value = kind._value_  # not `.value`: a property, called per job
        # Most of a deep queue is as it was: told apart without building its new values.
        if (
            old is not None
            and old[2] is not None
            and old[0] == value
            and old[1] == message
            and old[3] == start
        ):
            continue
        key = place if old is None or old[2] is None else old[2]
        new = (value, message[:max_message], key, start)
        if old != new:
            changes.append((job_id, *new))
    return changes


def still_waiting(pending: Sequence[PendingReason], placed: set[int]) -> Sequence[PendingReason]:
    """`pending` less the jobs in `placed`, in order: none, from the planner, but a plan
    made by hand may list a job in both."""
    if not placed:
        return pending
    return [reason for reason in pending if reason.job_id not in placed]
