"""Each node says how its agent fences jobs and whose account they run as, and which
owners' accounts it cannot use: the nodes API and `gpusched nodes` show it."""

from __future__ import annotations

from app.db import utcnow
from app.nodes.telemetry import TelemetryPolicy, ingest_heartbeat, register_node
from app.wire import GpuInfo, Heartbeat, Register

GPU = GpuInfo(index=0, uuid="GPU-n1-0", model="H100-80GB", memory_total_mb=81559)


def _register(api, name: str, **fields) -> None:
    with api.factory.begin() as session:
        register_node(session=session, report=Register(node=name, **fields))


def test_nodes_show_their_isolation_and_whose_account_jobs_run_as(api):
    _register(api, "n1", gpus=(GPU,), isolation="cgroup v1", jobs_run_as=None, grace_s=30.0)
    _register(api, "laptop", isolation="subreaper only", jobs_run_as="carol")
    with api.factory.begin() as session:
        ingest_heartbeat(
            session=session,
            heartbeat=Heartbeat(
                node="n1", interval_s=2,
                unusable_accounts={"dave": "no such account on this node"},
            ),
            policy=TelemetryPolicy(),
            now=utcnow(),
        )  # fmt: skip
    nodes = {n["name"]: n for n in api.client.get("/api/v1/nodes", headers=api.as_("bob")).json()}
    assert (nodes["n1"]["isolation"], nodes["n1"]["jobs_run_as"]) == ("cgroup v1", None)
    assert nodes["n1"]["unusable_accounts"] == {"dave": "no such account on this node"}
    assert (nodes["laptop"]["isolation"], nodes["laptop"]["jobs_run_as"]) == (
        "subreaper only",
        "carol",
    )
    # A new agent starts with none it cannot use: its heartbeats will say.
    _register(api, "n1", gpus=(GPU,), isolation="cgroup v2", jobs_run_as=None)
    one = api.client.get("/api/v1/nodes/n1", headers=api.as_("bob")).json()
    assert (one["isolation"], one["unusable_accounts"]) == ("cgroup v2", {})
