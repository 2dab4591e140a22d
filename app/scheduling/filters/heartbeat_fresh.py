"""Node filter: the node agent's heartbeat is recent.

Without a recent heartbeat we cannot know whether the agent would even start
the job, and all its GPU readings are suspect. Per node, once per cycle.
"""

from __future__ import annotations

from app.scheduling.status import OK, Context, Status, unschedulable
from app.scheduling.types import NodeView, ReasonKind


def check(node: NodeView, ctx: Context) -> Status:
    hb = node.heartbeat_at
    if hb is not None and (ctx.now - hb).total_seconds() <= ctx.settings.telemetry_max_age_s:
        return OK
    age = "never" if hb is None else f"{(ctx.now - hb).total_seconds():.0f}s ago"
    return unschedulable(ReasonKind.TELEMETRY_STALE, f"node {node.name} heartbeat stale ({age})")
