"""The fleet simulator (bench/fleet.py) against the real stack: five simulated agents in
this process register, heartbeat, take run and stop orders from their queues and report
starts and ends, all sealed and checked as the real agent does. Every job must end as
it should and every node stay READY, which only happens when the scheduler believed
every report (signed with the right key, naming the right node) and every order
reached the node it was meant for."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.nodes.keys import node_key
from bench.fleet import Fleet
from tests.support.stack import Stack

pytestmark = pytest.mark.e2e

STACK_AGENTS: dict[str, str] = {}  # no agent processes: the fleet plays every node
STACK_REPORTS_WORKER = True


@pytest.fixture
def fleet(stack: Stack) -> Iterator[tuple[Fleet, list[str]]]:
    names = [f"{stack.prefix}sim{i}" for i in range(5)]
    fleet = Fleet(
        redis_url=stack.redis_url,
        keys={name: node_key(stack.node_secret, name) for name in names},
        gpus=2,
        interval_s=0.5,
        time_scale=0.1,
    )
    fleet.start()
    try:
        stack.wait_nodes_ready(names, timeout=60)
        yield fleet, names
    finally:
        fleet.stop()


def test_simulated_agents_run_every_job_through_the_real_wire(
    stack: Stack, fleet: tuple[Fleet, list[str]]
) -> None:
    sim, names = fleet
    commands = ["true", "sleep 2", "sleep 5", "sleep 1"]
    jobs = [
        stack.submit({"command": commands[i % 4], "gpus": 1 + i % 2, "name": f"fleet-{i}"})
        for i in range(20)
    ]
    # One that runs until it is stopped: its cancel must reach its node as a stop order.
    endless = stack.submit({"command": "sleep 6000", "gpus": 1, "name": "fleet-endless"})
    stack.wait_status(endless["id"], "RUNNING", timeout=60)
    stack.cancel(endless["id"])
    assert stack.wait_status(endless["id"], "CANCELLED", timeout=60)["status"] == "CANCELLED"

    ended = [stack.wait_status(j["id"], "SUCCEEDED", "FAILED", timeout=120) for j in jobs]
    assert [j["status"] for j in ended] == ["SUCCEEDED"] * 20
    # The timed ones were reported started before they ended (the instant ones folded).
    timed = [j for j in jobs if j["command"] != "true"]
    started = [j for j in timed if any(e["to_status"] == "RUNNING" for e in stack.events(j["id"]))]
    assert len(started) == len(timed) == 15
    assert {stack.node(n)["state"] for n in names} == {"READY"}
    summary = sim.summary()
    assert summary["orders"].get("run_job", 0) >= 21
    assert summary["orders"].get("stop_job", 0) >= 1
    assert summary["orders_refused"] == 0
    assert summary["send_failures"] == 0
