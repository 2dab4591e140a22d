"""Removing a decommissioned node (DELETE /api/v1/nodes/{name}), as `kubectl delete node`."""

from __future__ import annotations

import json

from sqlalchemy import update

from app.cycle.snapshot import read_snapshot
from app.db import utcnow
from app.nodes.models import Node, NodeState
from app.nodes.telemetry import TelemetryPolicy, ingest_heartbeat, register_node
from app.wire import Heartbeat, Register, parse
from tests.cycle.jobs_api import add_node as add_ready_node
from tests.cycle.jobs_api import get_job, run_one_cycle, submit
from tests.foundation.builders import add_node


def _stop_agent(api, name: str) -> None:
    """As the scheduler marks a node whose heartbeats stopped (its jobs' GPUs kept)."""
    with api.factory.begin() as session:
        session.execute(update(Node).where(Node.name == name).values(state=NodeState.NOT_READY))


def _names(api) -> list[str]:
    return [n["name"] for n in api.client.get("/api/v1/nodes", headers=api.as_("alice")).json()]


def test_a_removed_node_leaves_the_lists_the_metrics_and_scheduling(api):
    add_node(api.factory, "n1", gpus=4)
    add_node(api.factory, "old", gpus=8, model="V100-32GB", state=NodeState.NOT_READY)

    r = api.client.delete("/api/v1/nodes/old", headers=api.as_("admin"))

    assert r.status_code == 200, r.text
    assert (r.json()["name"], r.json()["gpu_count"]) == ("old", 8)
    assert r.json()["removed_at"] is not None
    assert _names(api) == ["n1"]
    gone = api.client.get("/api/v1/nodes/old", headers=api.as_("alice"))
    assert gone.status_code == 404 and "was removed at" in gone.json()["detail"]
    metrics = api.client.get("/metrics").text
    assert 'node="old"' not in metrics and 'node="n1"' in metrics
    with api.factory() as session:
        assert [
            n.name
            for n in read_snapshot(session=session, now=utcnow(), half_life_s=3600.0).snapshot.nodes
        ] == ["n1"]
    # What only that node fitted is refused at once, with the remaining cluster's reason.
    job = api.client.post(
        "/api/v1/jobs", json={"command": ["x"], "gpus": 8}, headers=api.as_("alice")
    )
    assert job.status_code == 422
    assert "the largest node, n1, has 4" in job.text
    audit = api.client.get("/api/v1/audit?action=node.remove", headers=api.as_("admin")).json()
    assert [(e["actor"], e["target"]) for e in audit["items"]] == [("admin", "old")]
    assert audit["items"][0]["summary"].startswith("gpus=8, last_heartbeat=")
    # Twice: it is gone already.
    assert api.client.delete("/api/v1/nodes/old", headers=api.as_("admin")).status_code == 404


def test_a_node_whose_agent_runs_or_whose_gpus_are_held_is_not_removed(api):
    add_ready_node(api, gpus=2)  # n1, with fresh idle telemetry
    ready = api.client.delete("/api/v1/nodes/n1", headers=api.as_("admin"))
    assert ready.status_code == 409
    assert "node n1 is READY (its agent heartbeats): stop its agent first" in ready.text

    job = submit(api, gpus=2)
    run_one_cycle(api)
    assert get_job(api, job["id"])["status"] == "SCHEDULED"  # it holds both GPUs
    _stop_agent(api, "n1")
    held = api.client.delete("/api/v1/nodes/n1", headers=api.as_("admin"))
    assert held.status_code == 409
    assert f"jobs {job['id']} still hold GPUs on node n1: cancel or requeue" in held.text
    assert _names(api) == ["n1"]

    assert api.client.delete("/api/v1/nodes/n1", headers=api.as_("alice")).status_code == 403
    assert api.client.delete("/api/v1/nodes/nope", headers=api.as_("admin")).status_code == 404


def test_its_agent_registering_or_heartbeating_again_brings_it_back(api):
    for name in ("n1", "n2"):
        add_node(api.factory, name, gpus=1, state=NodeState.NOT_READY)
        assert api.client.delete(f"/api/v1/nodes/{name}", headers=api.as_("admin")).is_success
    assert _names(api) == []

    gpu = {"index": 0, "uuid": "GPU-n1-0", "model": "H100-80GB", "memory_total_mb": 81559}
    with api.factory.begin() as session:
        register_node(
            session=session, report=parse(Register, json.dumps({"node": "n1", "gpus": [gpu]}))
        )
        ingest_heartbeat(
            session=session,
            heartbeat=parse(
                Heartbeat, json.dumps({"node": "n2", "gpus": [{"index": 0, "util_pct": 0.0}]})
            ),
            policy=TelemetryPolicy(),
            now=utcnow(),
        )

    nodes = api.client.get("/api/v1/nodes", headers=api.as_("alice")).json()
    assert [(n["name"], n["state"], n["removed_at"]) for n in nodes] == [
        ("n1", "READY", None),
        ("n2", "READY", None),
    ]
    assert nodes[1]["health_message"] == "heartbeats resumed after it was removed"
