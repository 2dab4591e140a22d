"""Node filter: the node is ready, not drained and not in maintenance.

A drained node finishes its jobs but takes no new ones; so does a node once its
maintenance has begun; a node that is not ready cannot start anything. Per node,
once per cycle: cheapest cluster check.
"""

from __future__ import annotations

from app.scheduling.status import OK, Context, Status, unschedulable
from app.scheduling.types import NodeView, ReasonKind


def check(node: NodeView, ctx: Context) -> Status:
    if node.drained:
        return unschedulable(ReasonKind.NODE_NOT_READY, f"node {node.name} is drained")
    if node.maintenance_at is not None and node.maintenance_at <= ctx.now:
        # Since when: the node's maintenance_at (gpusched nodes), not a time in the text.
        return unschedulable(ReasonKind.NODE_NOT_READY, f"node {node.name} is in maintenance")
    if not node.ready:
        return unschedulable(ReasonKind.NODE_NOT_READY, f"node {node.name} is not ready")
    return OK
