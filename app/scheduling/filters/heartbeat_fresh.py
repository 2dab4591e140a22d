"""Node filter: the node agent's heartbeat is recent.

Without a recent heartbeat we cannot know whether the agent would even start
the job, and all its GPU readings are suspect. Per node, once per cycle.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from app.scheduling.status import OK, Context, Status, unschedulable
from app.scheduling.types import NodeView, ReasonKind


def check(node: NodeView, ctx: Context) -> Status:
    hb = node.heartbeat_at
    if hb is not None and (ctx.now - hb).total_seconds() <= ctx.settings.telemetry_max_age_s:
        return OK
    age = "never" if hb is None else f"{(ctx.now - hb).total_seconds():.0f}s ago"
    return unschedulable(ReasonKind.TELEMETRY_STALE, f"node {node.name} heartbeat stale ({age})")


def fresh_after(ctx: Context) -> datetime | None:
    """Precheck bound: a heartbeat at or after this instant surely passes `check`
    (millisecond of slack against float rounding; older ones go through `check`)."""
    try:
        return ctx.now - timedelta(seconds=ctx.settings.telemetry_max_age_s) + _MS
    except (OverflowError, ValueError):
        return None  # limit not a representable time span (e.g. infinite): no bound


_MS = timedelta(milliseconds=1)
