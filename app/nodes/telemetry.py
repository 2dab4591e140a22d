"""What agents tell us about their nodes: registration, heartbeats with GPU readings,
and the bounded telemetry history behind the charts.

Retention (defaults, see TelemetrySettings): raw samples every agent interval (5 s) for
2 hours, then 60-second averages for 14 days. At 5 s that is 1,440 raw + 20,160
averaged rows per GPU, about 1.4 M rows for a 64-GPU cluster.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Table, delete, func, select
from sqlalchemy.orm import Session, selectinload
from sqlalchemy.orm.util import identity_key

from app.db import Base, insert_rows, update_rows, utcnow
from app.errors import FieldError
from app.nodes.models import Gpu, GpuSample, Node, NodeState
from app.wire import GpuInfo, GpuReading, Heartbeat, Register, as_dict


@dataclass(frozen=True, slots=True)
class TelemetryPolicy:
    foreign_util_threshold_pct: float = 10.0
    foreign_memory_threshold_mb: int = 1024
    raw_retention_s: int = 2 * 3600
    rollup_step_s: int = 60
    rollup_retention_s: int = 14 * 86400


def register_node(*, session: Session, report: Register) -> Node:
    """Create or refresh the node and its GPUs. GPUs that disappeared are kept (allocations
    point at them) but marked unhealthy, so nothing is placed on them."""
    name = report.node
    node = session.scalar(select(Node).options(selectinload(Node.gpus)).where(Node.name == name))
    now = utcnow()
    if node is None:
        node = Node(name=name)
        session.add(node)
    node.registered_at = now  # by the agent running now (app.cycle.reconcile.node_left)
    node.hostname = report.hostname
    node.labels = dict(report.labels)
    node.agent_version = report.agent_version
    node.gpu_backend = report.backend
    node.state = NodeState.READY
    node.removed_at = None  # an agent registering a removed node brings it back
    node.health_message = report.message
    node.isolation = report.isolation or ""
    node.jobs_run_as = report.jobs_run_as
    node.unusable_accounts = {}  # a new agent: its heartbeats say which it cannot use
    node.grace_s = report.grace_s
    node.last_heartbeat_at = now
    _match_gpus_by_uuid(session=session, node=node, reported=report.gpus)
    session.flush()
    return node


def _match_gpus_by_uuid(*, session: Session, node: Node, reported: tuple[GpuInfo, ...]) -> None:
    """A GPU's row follows its UUID; its index is where NVML lists it on this boot. NVML's
    order is not kept across reboots, and a GPU that falls off the bus shifts the ones after
    it: matched by index, the next GPU would take over the lost one's row, allocations and
    history. A GPU no longer reported keeps its row (allocations point at it), marked
    unhealthy, with an index after the reported ones."""
    by_uuid = {gpu.uuid: gpu for gpu in node.gpus}
    reported_uuids = {info.uuid for info in reported}
    lost = [gpu for gpu in node.gpus if gpu.uuid not in reported_uuids]
    after = max((info.index for info in reported), default=-1) + 1
    index_of = {gpu.uuid: after + n for n, gpu in enumerate(sorted(lost, key=lambda g: g.id))}
    index_of.update((info.uuid, info.index) for info in reported)
    if any(gpu.index != index_of[gpu.uuid] for gpu in node.gpus):
        # Indices are unique per node: move every row aside before renumbering.
        for gpu in node.gpus:
            gpu.index = -1 - gpu.index
        session.flush()
    for info in reported:
        gpu = by_uuid.get(info.uuid) or Gpu(uuid=info.uuid, allocated_milli=0)
        if gpu.id is None:
            node.gpus.append(gpu)
        gpu.model = info.model
        gpu.memory_total_mb = info.memory_total_mb
        gpu.nvlink_peers = list(info.nvlink_peers)
        gpu.healthy = True
        gpu.health_message = ""
    for gpu in lost:
        gpu.healthy = False
        gpu.health_message = f"GPU {gpu.uuid} is no longer reported by the agent"
    for gpu in node.gpus:
        gpu.index = index_of[gpu.uuid]


def ingest_heartbeat(
    *, session: Session, heartbeat: Heartbeat, policy: TelemetryPolicy, now: datetime
) -> int | None:
    """`ingest_heartbeats` for one: its node's id, None if it is not registered."""
    ids = ingest_heartbeats(session=session, heartbeats=(heartbeat,), policy=policy, now=now)
    return ids.get(heartbeat.node)


def ingest_heartbeats(
    *, session: Session, heartbeats: Sequence[Heartbeat], policy: TelemetryPolicy, now: datetime
) -> dict[str, int]:
    """Store each heartbeat's latest readings and one raw sample per GPU, and track how
    long foreign load has been present or absent (the scheduler's stability window reads
    these); returns the ids of the heartbeats' nodes that are registered, by name. One
    heartbeat per node (the newest).

    Set-based, as the reports worker stores 5 nodes to a transaction: one read of the nodes
    and their GPUs, one UPDATE per table executed for all rows, one INSERT of the samples.
    Through the ORM's unit of work a 1,000-node fleet's heartbeats cost about 9 ms of CPU
    each (docs/benchmarks.md), more than one process can give 200 heartbeats a second."""
    session.flush()  # the caller's pending changes go before these statements
    names = [heartbeat.node for heartbeat in heartbeats]
    nodes = {
        row.name: row
        for row in session.execute(
            select(Node.id, Node.name, Node.state, Node.removed_at).where(Node.name.in_(names))
        )
    }
    gpus_of: dict[int, list[Any]] = defaultdict(list)
    for row in session.execute(
        select(Gpu.id, Gpu.node_id, Gpu.uuid, Gpu.index, Gpu.foreign_since, Gpu.idle_since).where(
            Gpu.node_id.in_([node.id for node in nodes.values()])
        )
    ):
        gpus_of[row.node_id].append(row)
    node_rows: list[dict[str, Any]] = []
    resumed_rows: list[dict[str, Any]] = []
    gpu_rows: list[dict[str, Any]] = []
    sample_rows: list[dict[str, Any]] = []
    for heartbeat in heartbeats:
        node = nodes.get(heartbeat.node)
        if node is None:
            continue  # not registered yet; the agent re-registers on its next start
        node_rows.append(
            {
                "id": node.id,
                "last_heartbeat_at": now,
                "unusable_accounts": dict(heartbeat.unusable_accounts),
                "interval_s": heartbeat.interval_s,
            }
        )
        if node.state is not NodeState.READY:
            # A removed node's agent runs after all (as a kubelet re-creates its deleted Node).
            removed = " after it was removed" if node.removed_at is not None else ""
            resumed_rows.append(
                {
                    "id": node.id,
                    "state": NodeState.READY,
                    "removed_at": None,
                    "health_message": f"heartbeats resumed{removed}",
                }
            )
        by_uuid = {gpu.uuid: gpu for gpu in gpus_of[node.id]}
        by_index = {gpu.index: gpu for gpu in gpus_of[node.id]}
        for reading in heartbeat.gpus:
            # By UUID (the index may name another GPU since a GPU was lost); an agent that
            # sends no UUID is matched by index.
            gpu = by_uuid.get(reading.uuid) if reading.uuid else by_index.get(reading.index)
            if gpu is None:
                continue
            gpu_rows.append(
                {
                    "id": gpu.id,
                    "healthy": reading.healthy,
                    "health_message": reading.health_message or "",
                    "unknown_readings": list(reading.unknown),
                    "mig_enabled": reading.mig_enabled,
                    "sampled_at": now,
                    "util_pct": reading.util_pct,
                    "memory_util_pct": reading.memory_util_pct,
                    "memory_used_mb": reading.memory_used_mb,
                    "temperature_c": reading.temperature_c,
                    "power_w": reading.power_w,
                    "processes": [as_dict(process) for process in reading.processes],
                    "foreign_util_pct": reading.foreign_util_pct,
                    "foreign_memory_mb": reading.foreign_memory_mb,
                    **_load_since(gpu, reading, policy=policy, now=now),
                }
            )
            sample_rows.append(
                {
                    "gpu_id": gpu.id,
                    "at": now,
                    "resolution_s": int(heartbeat.interval_s),
                    "util_pct": reading.util_pct,
                    "memory_used_mb": reading.memory_used_mb,
                    "temperature_c": reading.temperature_c,
                    "power_w": reading.power_w,
                    "job_ids": sorted({p.job_id for p in reading.processes if p.job_id}),
                }
            )
    # By primary key, in id order: every writer of these rows takes their locks in that
    # order, so none waits for another's crosswise.
    connection = session.connection()
    for table, rows in ((Node, node_rows), (Node, resumed_rows), (Gpu, gpu_rows)):
        update_rows(connection, cast(Table, table.__table__), rows)
    insert_rows(connection, cast(Table, GpuSample.__table__), sample_rows)
    _expire_loaded(session, Node, (row["id"] for row in node_rows))
    _expire_loaded(session, Gpu, (row["id"] for row in gpu_rows))
    return {name: node.id for name, node in nodes.items()}


def _load_since(
    gpu: Any, reading: GpuReading, *, policy: TelemetryPolicy, now: datetime
) -> dict[str, datetime | None]:
    """Since when the GPU has carried foreign load, or been idle, without interruption."""
    busy = (
        reading.foreign_util_pct > policy.foreign_util_threshold_pct
        or reading.foreign_memory_mb > policy.foreign_memory_threshold_mb
    )
    if busy:
        return {"foreign_since": gpu.foreign_since or now, "idle_since": None}
    if reading.unknown:
        # Not seen idle: the stability window starts again once it is read.
        return {"foreign_since": gpu.foreign_since, "idle_since": None}
    return {"foreign_since": None, "idle_since": gpu.idle_since or now}


def _expire_loaded(session: Session, model: type[Base], ids: Iterable[int]) -> None:
    """Objects of `model` this session already holds are read again when next used: the
    UPDATEs above went around them."""
    for id_ in ids:
        loaded = session.identity_map.get(identity_key(model, id_))
        if loaded is not None:
            session.expire(loaded)


def compact_telemetry(*, session: Session, policy: TelemetryPolicy, now: datetime) -> int:
    """Fold raw samples older than the raw retention into per-minute averages and drop
    averages past their retention. Returns the number of raw rows folded."""
    raw_cutoff = now - timedelta(seconds=policy.raw_retention_s)
    step = policy.rollup_step_s
    old = list(
        session.scalars(
            select(GpuSample)
            .where(GpuSample.at < raw_cutoff, GpuSample.resolution_s < step)
            .order_by(GpuSample.gpu_id, GpuSample.at)
            .limit(50_000)
        )
    )
    buckets: dict[tuple[int, int], list[GpuSample]] = defaultdict(list)
    for sample in old:
        buckets[(sample.gpu_id, int(sample.at.timestamp()) // step)].append(sample)
    for (gpu_id, bucket), rows in buckets.items():
        session.add(
            GpuSample(
                gpu_id=gpu_id,
                at=datetime.fromtimestamp(bucket * step, tz=now.tzinfo),
                resolution_s=step,
                util_pct=_mean(r.util_pct for r in rows),
                memory_used_mb=_int(_mean(r.memory_used_mb for r in rows)),
                temperature_c=_mean(r.temperature_c for r in rows),
                power_w=_mean(r.power_w for r in rows),
                job_ids=sorted({j for r in rows for j in r.job_ids}),
            )
        )
        for row in rows:
            session.delete(row)
    session.execute(
        delete(GpuSample).where(GpuSample.at < now - timedelta(seconds=policy.rollup_retention_s))
    )
    session.flush()
    return len(old)


def _mean(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _int(value: float | None) -> int | None:
    return None if value is None else round(value)


MAX_POINTS = 2000


def utilization_series(
    *, session: Session, node: str | None, since: datetime, until: datetime, step_s: int
) -> list[dict[str, Any]]:
    """Cluster (or one node's) GPU utilisation, memory and power per time bucket."""
    _bucket_count(since=since, until=until, step_s=step_s)
    query = select(
        GpuSample.at,
        GpuSample.gpu_id,
        GpuSample.util_pct,
        GpuSample.memory_used_mb,
        GpuSample.power_w,
    ).where(GpuSample.at >= since, GpuSample.at < until)
    if node is not None:
        node_id = session.scalar(select(Node.id).where(Node.name == node))
        if node_id is None:
            raise FieldError("node", f"no node named {node!r}")
        query = query.join(Gpu, Gpu.id == GpuSample.gpu_id).where(Gpu.node_id == node_id)
    origin = int(since.timestamp())
    # Per bucket and GPU, average first, so a GPU with more samples does not weigh more.
    per_gpu: dict[tuple[int, int], list[tuple[Any, Any, Any]]] = defaultdict(list)
    for at, gpu_id, util, mem, power in session.execute(query):
        bucket = (int(at.timestamp()) - origin) // step_s
        per_gpu[(bucket, gpu_id)].append((util, mem, power))
    points: dict[int, dict[str, Any]] = {}
    for (bucket, _gpu), rows in sorted(per_gpu.items()):
        point = points.setdefault(bucket, {"utils": [], "mem": 0.0, "power": 0.0, "gpus": 0})
        util = _mean(r[0] for r in rows)
        if util is not None:
            point["utils"].append(util)
        point["mem"] += _mean(r[1] for r in rows) or 0.0
        point["power"] += _mean(r[2] for r in rows) or 0.0
        point["gpus"] += 1
    return [
        {
            "at": datetime.fromtimestamp(origin + bucket * step_s, tz=since.tzinfo).isoformat(),
            "util_pct": _mean(p["utils"]),
            "memory_used_mb": round(p["mem"]),
            "power_w": round(p["power"], 1),
            "gpus": p["gpus"],
        }
        for bucket, p in sorted(points.items())
    ]


@dataclass
class _GpuRow:
    node: str
    index: int
    model: str
    utils: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    jobs: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))


def gpu_series(
    *, session: Session, node: str | None, since: datetime, until: datetime, step_s: int
) -> list[dict[str, Any]]:
    """Each GPU's utilisation per time bucket (the rows of a heatmap), and the jobs its
    samples in the bucket ran: one list per GPU, `buckets` long, None where no sample was
    taken (the node was down, or the GPU not there yet)."""
    buckets = _bucket_count(since=since, until=until, step_s=step_s)
    gpus = select(Gpu.id, Gpu.index, Gpu.model, Node.name).join(Node, Node.id == Gpu.node_id)
    if node is not None:
        if session.scalar(select(Node.id).where(Node.name == node)) is None:
            raise FieldError("node", f"no node named {node!r}")
        gpus = gpus.where(Node.name == node)
    rows = {
        gpu_id: _GpuRow(node=name, index=index, model=model)
        for gpu_id, index, model, name in session.execute(
            gpus.where(Node.removed_at.is_(None)).order_by(Node.name, Gpu.index)
        )
    }
    origin = int(since.timestamp())
    samples = select(GpuSample.at, GpuSample.gpu_id, GpuSample.util_pct, GpuSample.job_ids).where(
        GpuSample.at >= since, GpuSample.at < until, GpuSample.gpu_id.in_(rows)
    )
    for at, gpu_id, util, job_ids in session.execute(samples):
        bucket = (int(at.timestamp()) - origin) // step_s
        if util is not None:
            rows[gpu_id].utils[bucket].append(util)
        rows[gpu_id].jobs[bucket].update(job_ids or ())
    return [
        {
            "node": row.node,
            "index": row.index,
            "model": row.model,
            "util_pct": [_mean(row.utils.get(b, ())) for b in range(buckets)],
            "job_ids": [sorted(row.jobs.get(b, ())) for b in range(buckets)],
        }
        for row in rows.values()
    ]


def _bucket_count(*, since: datetime, until: datetime, step_s: int) -> int:
    if step_s < 1:
        raise FieldError("step", "must be at least 1 second")
    if until <= since:
        raise FieldError("since", "must be in the past")
    if (until - since).total_seconds() / step_s > MAX_POINTS:
        raise FieldError("step", f"too many points: at most {MAX_POINTS} per request")
    # Up to the one `until` falls in (partial), as samples are bucketed by whole seconds.
    return (int(until.timestamp()) - int(since.timestamp())) // step_s + 1


def latest_sample_time(*, session: Session) -> datetime | None:
    return session.scalar(select(func.max(Gpu.sampled_at)))


def job_series(
    *, session: Session, job_id: int, since: datetime, until: datetime
) -> list[dict[str, Any]]:
    """Per-sample readings of the GPUs the job held, while it held them (all attempts)."""
    from app.nodes.models import Allocation

    windows = session.execute(
        select(Allocation.gpu_id, Allocation.created_at, Allocation.released_at).where(
            Allocation.job_id == job_id, Allocation.gpu_id.is_not(None)
        )
    ).all()
    if not windows:
        return []
    rows = session.execute(
        select(GpuSample, Gpu.index, Node.name)
        .join(Gpu, Gpu.id == GpuSample.gpu_id)
        .join(Node, Node.id == Gpu.node_id)
        .where(
            GpuSample.gpu_id.in_({w[0] for w in windows}),
            GpuSample.at >= since,
            GpuSample.at <= until,
        )
        .order_by(GpuSample.at)
    ).all()
    points = []
    for sample, index, node in rows:
        held = any(
            gpu_id == sample.gpu_id and start <= sample.at <= (end or until)
            for gpu_id, start, end in windows
        )
        if held:
            points.append(
                {
                    "at": sample.at.isoformat(),
                    "node": node,
                    "gpu_index": index,
                    "util_pct": sample.util_pct,
                    "memory_used_mb": sample.memory_used_mb,
                    "power_w": sample.power_w,
                    "resolution_s": sample.resolution_s,
                }
            )
    return points
