"""Reading nodes and GPUs, and draining them."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from app.audit.service import record
from app.auth.service import Principal
from app.db import utcnow
from app.errors import Conflict, NotFound
from app.nodes.models import Allocation, Gpu, Node, NodeState
from app.nodes.schemas import GpuOut, NodeOut


def _gpu_out(gpu: Gpu) -> GpuOut:
    return GpuOut(
        index=gpu.index,
        uuid=gpu.uuid,
        model=gpu.model,
        memory_total_mb=gpu.memory_total_mb,
        nvlink_peers=gpu.nvlink_peers,
        healthy=gpu.healthy,
        health_message=gpu.health_message,
        unknown_readings=list(gpu.unknown_readings or ()),
        mig_enabled=gpu.mig_enabled,
        allocated=gpu.allocated_milli / 1000,
        sampled_at=gpu.sampled_at,
        util_pct=gpu.util_pct,
        memory_util_pct=gpu.memory_util_pct,
        memory_used_mb=gpu.memory_used_mb,
        temperature_c=gpu.temperature_c,
        power_w=gpu.power_w,
        processes=gpu.processes,
        foreign_util_pct=gpu.foreign_util_pct,
        foreign_memory_mb=gpu.foreign_memory_mb,
        foreign_since=gpu.foreign_since,
    )


def _node_out(node: Node, now: datetime | None = None) -> NodeOut:
    maintenance_begun = node.maintenance_at is not None and node.maintenance_at <= (now or utcnow())
    return NodeOut(
        name=node.name,
        hostname=node.hostname,
        labels=node.labels,
        agent_version=node.agent_version,
        gpu_backend=node.gpu_backend,
        state=node.state,
        drained=node.drained or maintenance_begun,
        drain_reason=node.drain_reason,
        maintenance_at=node.maintenance_at,
        health_message=node.health_message,
        isolation=node.isolation,
        jobs_run_as=node.jobs_run_as,
        unusable_accounts=node.unusable_accounts or {},
        registered_at=node.registered_at,
        last_heartbeat_at=node.last_heartbeat_at,
        removed_at=node.removed_at,
        gpu_count=len(node.gpus),
        gpus_allocated=sum(g.allocated_milli for g in node.gpus) / 1000,
        gpus=[_gpu_out(g) for g in node.gpus],
    )


def list_nodes(*, session: Session) -> list[NodeOut]:
    nodes = session.scalars(
        select(Node)
        .options(selectinload(Node.gpus))
        .where(Node.removed_at.is_(None))
        .order_by(Node.name)
    )
    now = utcnow()
    return [_node_out(n, now) for n in nodes]


def _node(session: Session, name: str) -> Node:
    node = session.scalar(select(Node).options(selectinload(Node.gpus)).where(Node.name == name))
    if node is None:
        raise NotFound(f"no node named {name!r}")
    if node.removed_at is not None:
        raise NotFound(
            f"node {name} was removed at {node.removed_at:%Y-%m-%d %H:%M:%S} UTC; "
            "its agent registering again brings it back"
        )
    return node


def get_node(*, session: Session, name: str) -> NodeOut:
    return _node_out(_node(session, name))


def drain(
    *,
    session: Session,
    principal: Principal,
    name: str,
    reason: str = "",
    at: datetime | None = None,
    now: datetime,
) -> NodeOut:
    """Draining stops new placements; running jobs finish normally (as Slurm's DRAIN).
    With a later `at`, maintenance: until then the node takes only jobs whose time limit
    ends by `at` (as a Slurm maint reservation), from then on none. Draining again moves
    or cancels a planned maintenance."""
    node = _node(session, name)
    planned = at if at is not None and at > now else None
    if planned is not None and node.drained:
        # Planning it would let jobs on again until then: say so rather than do it.
        raise Conflict(f"node {name} is drained now: undrain it to plan a maintenance later")
    node.drained = planned is None
    node.maintenance_at = planned
    by = f"by {principal.name}"
    # When: the node's maintenance_at, which clients format; not a time in the text.
    default = f"maintenance planned {by}" if planned else f"drained {by}"
    node.drain_reason = reason or default
    info = {"reason": node.drain_reason}
    if planned is not None:
        info["at"] = planned.isoformat()
    record(session=session, actor=principal.name, action="node.drain", target=name, info=info)
    session.commit()
    return _node_out(node, now)


def undrain(*, session: Session, principal: Principal, name: str) -> NodeOut:
    """Place jobs on the node again; a planned maintenance is called off."""
    node = _node(session, name)
    node.drained = False
    node.maintenance_at = None
    node.drain_reason = ""
    record(session=session, actor=principal.name, action="node.undrain", target=name, info={})
    session.commit()
    return _node_out(node)


def remove(*, session: Session, principal: Principal, name: str, now: datetime) -> NodeOut:
    """Take a decommissioned node out of every view and of scheduling (as `kubectl delete
    node`). Only a node whose agent has stopped (NOT_READY) and on which no job holds GPUs:
    a running agent would bring it back at its next heartbeat. The row stays, since the
    history of jobs that ran there refers to it."""
    node = _node(session, name)
    if node.state is NodeState.READY:
        raise Conflict(
            f"node {name} is READY (its agent heartbeats): stop its agent first; a removed "
            "node whose agent still runs comes back at its next heartbeat"
        )
    holders = session.scalars(
        select(Allocation.job_id)
        .where(Allocation.node_id == node.id, Allocation.released_at.is_(None))
        .distinct()
        .order_by(Allocation.job_id)
    ).all()
    if holders:
        jobs = ", ".join(str(job) for job in holders)
        raise Conflict(f"jobs {jobs} still hold GPUs on node {name}: cancel or requeue them first")
    node.removed_at = now
    last = node.last_heartbeat_at
    info = {"gpus": len(node.gpus), "last_heartbeat": last.isoformat() if last else None}
    record(session=session, actor=principal.name, action="node.remove", target=name, info=info)
    session.commit()
    return _node_out(node, now)
