"""Maintenance (Slurm's maint reservation): a node going into maintenance at T takes only
jobs whose time limit (with grace period) ends by T, and none once T has come."""

from __future__ import annotations

import pytest

from app.scheduling import PolicySettings, ReasonKind, plan_cycle

from .builders import T0, at, job, node, running, snap

HOUR = 3600


def _placed_on(plan, job_id):  # type: ignore[no-untyped-def]
    pl = plan.placement_for(job_id)
    return None if pl is None else pl.node


@pytest.mark.parametrize(
    ("limit_s", "placed", "ends"),
    [
        (HOUR, True, None),  # ends an hour before the maintenance
        (2 * HOUR, True, None),  # ends as it begins: still fine
        (2 * HOUR + 1, False, "this job's time limit (with its grace period) ends after it begins"),
        (None, False, "this job has no time limit"),  # could run into it: never there
    ],
)  # fmt: skip
def test_a_node_going_into_maintenance_takes_only_jobs_that_end_by_then(
    limit_s: int | None, placed: bool, ends: str | None
) -> None:
    s = snap([node("a").gpus(8).maintenance(2 * HOUR)], pending=[job(1, max_runtime_s=limit_s)])
    p = plan_cycle(s, now=T0)
    assert (_placed_on(p, 1) == "a") is placed
    if not placed:
        r = p.reasons()[1]
        assert r.kind is ReasonKind.MAINTENANCE
        assert r.message == (
            "node a goes into maintenance (see the node's maintenance time) and takes only "
            f"jobs whose time limit ends by then; {ends}"
        )


def test_once_maintenance_has_begun_the_node_takes_nothing() -> None:
    s = snap([node("a").gpus(8).maintenance(-60)], pending=[job(1, max_runtime_s=60)])
    r = plan_cycle(s, now=T0).reasons()[1]
    assert r.kind is ReasonKind.NODE_NOT_READY
    assert r.message == "node a is in maintenance"  # since when: the node's maintenance_at


def test_long_jobs_go_elsewhere_and_short_ones_of_the_same_shape_still_use_it() -> None:
    fifo = PolicySettings(queue_policy="fifo")
    # Node a (maintenance in 2h) is the tightest fit, which best fit would pick.
    s = snap(
        [node("a").gpus(1).maintenance(2 * HOUR), node("b").gpus(4)],
        pending=[job(1, max_runtime_s=8 * HOUR), job(2, max_runtime_s=HOUR)],
    )
    assert [_placed_on(plan_cycle(s, now=T0, settings=fifo), i) for i in (1, 2)] == ["b", "a"]
    # Job 2, as long as job 1, finds no room left; that must not make job 3, of the same
    # shape but short, look as if nothing fit: it still gets node a.
    s = snap(
        [node("a").gpus(4).maintenance(2 * HOUR), node("b").gpus(1)],
        pending=[
            job(1, max_runtime_s=8 * HOUR),
            job(2, max_runtime_s=8 * HOUR),
            job(3, max_runtime_s=HOUR),
        ],
    )
    p = plan_cycle(s, now=T0, settings=fifo)
    assert [_placed_on(p, i) for i in (1, 2, 3)] == ["b", None, "a"]
    assert p.reasons()[2].kind is ReasonKind.MAINTENANCE


def test_a_gang_needs_every_node_to_end_before_maintenance() -> None:
    s = snap(
        [node("a").gpus(8).maintenance(HOUR), node("b").gpus(8)],
        pending=[job(1, gpus=8, nodes=2, max_runtime_s=2 * HOUR)],
    )
    p = plan_cycle(s, now=T0)
    assert p.placements == ()
    assert p.reasons()[1].kind is ReasonKind.MAINTENANCE


def test_no_preemption_on_a_node_the_job_may_not_use() -> None:
    victims = [
        running(job(10 + i, priority=0, preemptible=True), {"a": (i,)}, started_ago_s=7200)
        for i in range(4)
    ]
    urgent = job(1, gpus=4, priority=100, max_runtime_s=8 * HOUR)
    cluster = node("a").gpus(4)
    without = plan_cycle(snap([cluster], pending=[urgent], running=victims), now=T0)
    assert len(without.preemptions) == 4  # the rule that would apply without maintenance
    s = snap([cluster.maintenance(HOUR)], pending=[urgent], running=victims)
    assert plan_cycle(s, now=T0).preemptions == ()


def test_backfill_reserves_the_head_where_it_may_run() -> None:
    # The head (8 GPUs, 8h) may not use node a (maintenance in 2h), so it waits for node
    # b, whose job ends in an hour; the reservation says so, and a 1h job may use a.
    s = snap(
        [node("a").gpus(8).maintenance(2 * HOUR), node("b").gpus(8)],
        pending=[job(1, gpus=8, max_runtime_s=8 * HOUR), job(2, gpus=8, max_runtime_s=HOUR)],
        running=[running(job(9, gpus=8, max_runtime_s=2 * HOUR), {"b": tuple(range(8))})],
    )
    p = plan_cycle(s, now=T0, settings=PolicySettings(queue_policy="fifo"))
    assert _placed_on(p, 2) == "a"
    head = p.reasons()[1]
    assert head.estimated_start == at(HOUR)  # job 9 started 1h ago with a 2h limit
    # Node a had room for it: maintenance is why it waits, though job 2 took a since.
    assert head.kind is ReasonKind.MAINTENANCE
    assert head.message.endswith("; GPUs reserved for it (see its estimated start)")
