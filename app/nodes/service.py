"""Reading nodes and GPUs, and draining them."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from app.audit.service import record
from app.auth.service import Principal
from app.errors import NotFound
from app.nodes.models import Gpu, Node
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


def _node_out(node: Node) -> NodeOut:
    return NodeOut(
        name=node.name,
        hostname=node.hostname,
        labels=node.labels,
        agent_version=node.agent_version,
        gpu_backend=node.gpu_backend,
        state=node.state,
        drained=node.drained,
        drain_reason=node.drain_reason,
        health_message=node.health_message,
        registered_at=node.registered_at,
        last_heartbeat_at=node.last_heartbeat_at,
        gpu_count=len(node.gpus),
        gpus_allocated=sum(g.allocated_milli for g in node.gpus) / 1000,
        gpus=[_gpu_out(g) for g in node.gpus],
    )


def list_nodes(*, session: Session) -> list[NodeOut]:
    nodes = session.scalars(select(Node).options(selectinload(Node.gpus)).order_by(Node.name))
    return [_node_out(n) for n in nodes]


def _node(session: Session, name: str) -> Node:
    node = session.scalar(select(Node).options(selectinload(Node.gpus)).where(Node.name == name))
    if node is None:
        raise NotFound(f"no node named {name!r}")
    return node


def get_node(*, session: Session, name: str) -> NodeOut:
    return _node_out(_node(session, name))


def set_drained(
    *, session: Session, principal: Principal, name: str, drained: bool, reason: str = ""
) -> NodeOut:
    """Draining stops new placements; running jobs finish normally (as Slurm's DRAIN)."""
    node = _node(session, name)
    node.drained = drained
    node.drain_reason = (reason or f"drained by {principal.name}") if drained else ""
    action, info = (
        ("node.drain", {"reason": node.drain_reason}) if drained else ("node.undrain", {})
    )
    record(session=session, actor=principal.name, action=action, target=name, info=info)
    session.commit()
    return _node_out(node)
