"""Why a waiting job shows no estimated start (issue 42 point 2): every waiting job that
may run has an estimated start or a reason why none can be given.

The cycle estimates a start only where it knows one: the begin time, the window's
opening, and the first job in line that cannot start now, for which backfill reserves
GPUs (as Slurm's `StartTime` of the top job). The others' estimate would need the whole
queue simulated forward; instead they say which of these cases they are in.
"""

from __future__ import annotations

from datetime import datetime

from app.scheduling.types import ReasonKind

_CANNOT_START = frozenset(
    {
        ReasonKind.NEVER_FITS.value,
        ReasonKind.GPU_MODEL_UNAVAILABLE.value,
        ReasonKind.NO_ACCOUNT.value,
    }
)
_NODES_UNUSABLE = frozenset(
    {
        ReasonKind.NODE_NOT_READY.value,
        ReasonKind.TELEMETRY_STALE.value,
        ReasonKind.GPU_UNHEALTHY.value,
        ReasonKind.GPU_UNKNOWN.value,
        ReasonKind.GPU_MIG.value,
        ReasonKind.FOREIGN_PROCESS.value,
        ReasonKind.MAINTENANCE.value,
    }
)
# The backfill head's reason when the GPUs it waits for have no known end.
UNKNOWN_END = "start time unknown"

NOT_RANKED = "no estimate yet: the next full scheduling cycle ranks it and estimates"
RESERVED_FOR_THE_FIRST = (
    "no estimate: the scheduler reserves GPUs, and estimates a start, only for the first "
    "job in line that cannot start now; jobs behind it start as running jobs end"
)


# Reasons that end at a known time, which the core gives as the job's estimated start:
# the begin time, the off-peak window's next opening. The API shows it as pending_until.
TIMED_REASONS = frozenset({ReasonKind.BEGIN_TIME.value, ReasonKind.WINDOW_CLOSED.value})


def estimate_note(
    *,
    reason: str | None,
    message: str | None,
    position: int | None,
    start: datetime | None,
) -> str | None:
    """Why a waiting, unheld job has no estimated start; None when it has one."""
    if start is not None:
        return None
    if reason == ReasonKind.DEPENDENCY.value:
        return "no estimate: it is not in line until its dependencies end"
    if reason == ReasonKind.ARRAY_LIMIT.value:
        return "no estimate: it is not in line until tasks of its array end"
    if reason == ReasonKind.NEVER_IN_WINDOW.value:
        return "no estimate: no opening of its off-peak window is long enough (see the reason)"
    if reason == ReasonKind.NEW.value or position is None:
        return NOT_RANKED
    if reason in _CANNOT_START:
        return "no estimate: no node of the cluster can run it as it is (see the reason)"
    if reason == ReasonKind.QUOTA.value:
        return "no estimate: it waits until its project's jobs free quota"
    if reason in _NODES_UNUSABLE:
        return "no estimate: it waits for nodes or GPUs to become usable (see the reason)"
    # The first in line without a start: the GPUs held for it (or, all of them busy, every
    # GPU it could use) are held by jobs of unknown end.
    if (message is not None and UNKNOWN_END in message) or (
        position == 1 and reason == ReasonKind.WAITING_FOR_GPUS.value
    ):
        return (
            "no estimate: the GPUs it waits for are held by running jobs with neither "
            "a runtime estimate nor a time limit"
        )
    return RESERVED_FOR_THE_FIRST
