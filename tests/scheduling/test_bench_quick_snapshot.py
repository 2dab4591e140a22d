"""The benchmark's quick-cycle snapshot (`bench/cycle.py` `after_full_cycle`) is a state
the live scheduler could really be in: the full plan applied, nothing double-booked."""

from __future__ import annotations

from app.cycle.snapshot import head_depth
from app.scheduling import PolicySettings, plan_cycle
from bench.cycle import NOW, after_full_cycle, build


def test_quick_snapshot_applies_the_full_plan() -> None:
    full = build(20, 1000, 0.5)
    plan = plan_cycle(full, now=NOW, settings=PolicySettings(), seed=0)
    quick = after_full_cycle(full, plan)

    placed = {p.job_id for p in plan.placements}
    victims = {p.victim_job_id for p in plan.preemptions}
    running = {r.job.id for r in quick.running}
    assert placed and placed <= running
    assert not victims & running
    assert not placed & {j.id for j in quick.pending}
    assert len(quick.pending) == head_depth(quick.nodes) < 1000 - len(placed)  # truncated
    # The head keeps the full cycle's order.
    order = [i for i in plan.queue_order if i not in placed]
    assert [j.id for j in quick.pending] == order[: len(quick.pending)]
    for node in quick.nodes:
        for gpu in node.gpus:
            assert 0 <= gpu.allocated_milli <= 1000, (node.name, gpu.index)
    assert sum(g.allocated_milli for n in quick.nodes for g in n.gpus) > sum(
        g.allocated_milli for n in full.nodes for g in n.gpus
    )
