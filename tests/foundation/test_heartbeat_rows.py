"""Heartbeats of several nodes stored together: each GPU row and node row gets its own
readings, and on PostgreSQL by a fixed number of statements, not one UPDATE and one
INSERT per GPU (as an executemany those were a third of the reports process's time at
1,000 nodes, docs/benchmarks.md)."""

from __future__ import annotations

import math
from datetime import timedelta

from sqlalchemy import select

from app.db import utcnow
from app.nodes.models import Gpu, GpuSample, Node, NodeState
from app.nodes.telemetry import TelemetryPolicy, ingest_heartbeats, register_node
from app.wire import GpuInfo, GpuProcessReading, GpuReading, Heartbeat, Register
from tests.support.statements import statements_sent

GPUS = 4


def _register(api, names: list[str]) -> None:
    with api.factory.begin() as session:
        for name in names:
            gpus = tuple(
                GpuInfo(index=i, uuid=f"{name}-{i}", model="A100", memory_total_mb=40_000)
                for i in range(GPUS)
            )
            register_node(session=session, report=Register(node=name, gpus=gpus))


def _heartbeat(name: str, n: int) -> Heartbeat:
    """Readings that differ per node and GPU; GPU 1 of every node carries foreign load,
    GPU 2 cannot say who uses it."""
    readings = tuple(
        GpuReading(
            index=i,
            uuid=f"{name}-{i}",
            util_pct=float(10 * n + i),
            memory_used_mb=100 * n + i,
            temperature_c=None if i == 3 else 40.0 + i,
            processes=(GpuProcessReading(pid=1000 + i, used_memory_mb=5, job_id=None),)
            if i == 1
            else (),
            foreign_util_pct=90.0 if i == 1 else 0.0,
            unknown=("processes: NVMLError",) if i == 2 else (),
        )
        for i in range(GPUS)
    )
    return Heartbeat(
        node=name, interval_s=5, gpus=readings, unusable_accounts={"u": f"missing on {name}"}
    )


def _store(api, heartbeats: list[Heartbeat], now) -> list[tuple[str, bool]]:
    """Stores `heartbeats` in one transaction; returns (statement, executemany) of each
    statement sent."""
    with statements_sent(api.factory) as sent, api.factory.begin() as session:
        ids = ingest_heartbeats(
            session=session, heartbeats=heartbeats, policy=TelemetryPolicy(), now=now
        )
    assert set(ids) == {hb.node for hb in heartbeats}
    return [(s.statement, s.executemany) for s in sent]


def test_heartbeats_stored_together_each_row_its_own(api):
    names = ["n1", "n2", "n3"]
    _register(api, names)
    with api.factory.begin() as session:  # two fell silent; their heartbeats resume
        for node in session.scalars(select(Node).where(Node.name.in_(["n1", "n3"]))):
            node.state = NodeState.NOT_READY
    now = utcnow()
    _store(api, [_heartbeat(name, n) for n, name in enumerate(names)], now)

    with api.factory() as session:
        gpus = {
            gpu.uuid: gpu
            for gpu in session.scalars(select(Gpu).join(Node).where(Node.name.in_(names)))
        }
        for n, name in enumerate(names):
            for i in range(GPUS):
                gpu = gpus[f"{name}-{i}"]
                assert gpu.util_pct == 10 * n + i and gpu.memory_used_mb == 100 * n + i
                assert gpu.temperature_c == (None if i == 3 else 40.0 + i)
                assert gpu.sampled_at == now
                assert gpu.processes == (
                    [{"pid": 1001, "used_memory_mb": 5, "job_id": None}] if i == 1 else []
                )
                assert gpu.unknown_readings == (["processes: NVMLError"] if i == 2 else [])
                # Foreign load since now; idle since now unless busy or unknown.
                assert gpu.foreign_since == (now if i == 1 else None)
                assert gpu.idle_since == (None if i in (1, 2) else now)
        nodes = {node.name: node for node in session.scalars(select(Node))}
        for name in names:
            assert nodes[name].state is NodeState.READY
            assert nodes[name].last_heartbeat_at == now
            assert nodes[name].unusable_accounts == {"u": f"missing on {name}"}
        samples = session.execute(select(GpuSample.gpu_id, GpuSample.util_pct)).all()
        assert sorted(util for _, util in samples) == sorted(
            float(10 * n + i) for n in range(len(names)) for i in range(GPUS)
        )

    # The next heartbeat keeps when foreign load began, and moves nothing else's.
    later = now + timedelta(seconds=5)
    _store(api, [_heartbeat("n2", 7)], later)
    with api.factory() as session:
        busy = session.scalar(select(Gpu).where(Gpu.uuid == "n2-1"))
        other = session.scalar(select(Gpu).where(Gpu.uuid == "n1-0"))
        assert busy.foreign_since == now and busy.util_pct == 71.0
        assert other.util_pct == 0.0 and other.sampled_at == now


def test_statements_do_not_grow_with_the_gpus(api):
    """On PostgreSQL the GPUs' rows are locked, updated and sampled by one statement each,
    however many nodes a transaction stores (SQLite: one executemany each)."""
    few, many = ["a1", "a2"], [f"b{i}" for i in range(6)]
    _register(api, few + many)
    now = utcnow()
    two = _store(api, [_heartbeat(name, 0) for name in few], now)
    six = _store(api, [_heartbeat(name, 0) for name in many], now)
    assert len(six) == len(two)
    if api.factory.kw["bind"].dialect.name == "postgresql":
        assert not any(executemany for _, executemany in six), six
        assert sum(statement.startswith("UPDATE gpu ") for statement, _ in six) == 1


def test_a_reading_that_is_not_a_number_does_not_fail_the_batch(api):
    """JSON, in which PostgreSQL receives the rows, has no NaN or infinity: such a float
    goes as text, and the server reads the same float back."""
    names = ["x1", "x2"]
    _register(api, names)
    odd = Heartbeat(
        node="x1",
        interval_s=5,
        gpus=tuple(
            GpuReading(index=i, uuid=f"x1-{i}", util_pct=5.0, power_w=value)
            for i, value in enumerate((math.nan, math.inf, -math.inf, 250.0))
        ),
    )
    now = utcnow()
    _store(api, [odd, _heartbeat("x2", 1)], now)
    with api.factory() as session:
        power = dict(
            session.execute(select(Gpu.uuid, Gpu.power_w).where(Gpu.uuid.like("x1-%"))).all()
        )
        utils = session.scalars(select(Gpu.util_pct).where(Gpu.uuid.like("x%"))).all()
    assert power["x1-3"] == 250.0 and power["x1-1"] == math.inf and power["x1-2"] == -math.inf
    # SQLite keeps no NaN (it stores NULL); PostgreSQL does.
    assert power["x1-0"] is None or math.isnan(power["x1-0"])
    assert sorted(utils) == [5.0] * GPUS + [10.0 + i for i in range(GPUS)]
