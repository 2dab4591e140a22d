"""Case tables for the scorers, expected values worked out in the comments."""

from __future__ import annotations

import pytest

from app.scheduling import PolicySettings, plan_cycle, planner
from app.scheduling.cycle_state import CycleState
from app.scheduling.placement import choose
from app.scheduling.scorers import best_fit, thermal, topology
from app.scheduling.state import NodeState, Request
from app.scheduling.status import Context

from .builders import T0, job, node, snap


def _state(*builders) -> CycleState:  # type: ignore[no-untyped-def]
    s = snap(list(builders))
    return planner.build(s, Context(now=T0, settings=PolicySettings()), 0)


def _node(c: CycleState, name: str) -> NodeState:
    return c.node_by_name[name]


@pytest.mark.parametrize(
    ("builder", "gpus", "expected"),
    [
        # 8 free, 1 placed: 7000 milli left of 8000 -> 1 - 7/8 = 0.125
        (node("a").gpus(8), 1, 0.125),
        # 1 free (7 allocated), 1 placed: 0 left -> 1.0
        (node("a").gpus(8).alloc(0).alloc(1).alloc(2).alloc(3).alloc(4).alloc(5).alloc(6), 1, 1.0),
        # 8 free, 8 placed: 0 left -> 1.0 (a big job filling an empty node is a perfect fit)
        (node("a").gpus(8), 8, 1.0),
        # 4 free of 4, 2 placed: 2000 of 4000 left -> 0.5
        (node("a").gpus(4), 2, 0.5),
    ],
)
def test_best_fit(builder, gpus: int, expected: float) -> None:  # type: ignore[no-untyped-def]
    c = _state(builder)
    n = _node(c, "a")
    req = Request(gpus, 1, 1000, 0, None)
    chosen = choose(n, req, False)
    assert chosen is not None
    assert best_fit.score(req, n, chosen) == pytest.approx(expected)


def test_best_fit_shared_gpu() -> None:
    # 2 GPUs, gpu0 has 600 milli allocated: free = 400 + 1000 = 1400; place 400 -> 1000 left
    # score = 1 - 1000/2000 = 0.5, and the partly used GPU 0 is chosen (packing).
    c = _state(node("a").gpus(2).alloc(0, 600))
    n = _node(c, "a")
    req = Request(1, 1, 400, 0, None)
    chosen = choose(n, req, False)
    assert chosen is not None and [s.index for s in chosen] == [0]
    assert best_fit.score(req, n, chosen) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("links", "indices", "expected"),
    [
        # 4 GPUs all in one NVLink group: 6 of 6 pairs linked -> 1.0
        (((0, 1, 2, 3),), (0, 1, 2, 3), 1.0),
        # two pairs {0,1},{2,3}: of 6 pairs only (0,1),(2,3) linked -> 2/6
        (((0, 1), (2, 3)), (0, 1, 2, 3), 2 / 6),
        # no links, 2 GPUs -> 0/1
        ((), (0, 1), 0.0),
        # one GPU is always local -> 1.0
        ((), (2,), 1.0),
    ],
)
def test_topology(links, indices, expected: float) -> None:  # type: ignore[no-untyped-def]
    c = _state(node("a").gpus(4).nvlink(*links))
    n = _node(c, "a")
    chosen = [n.slots[i] for i in indices]
    assert topology.score(Request(len(indices), 1, 1000, 0, None), n, chosen) == pytest.approx(
        expected
    )


@pytest.mark.parametrize(
    ("util", "temp", "expected"),
    [
        (0, 40, 1.0),  # idle and cool: 1 - 0 - 0
        (100, 40, 0.5),  # fully busy: 1 - 0.5
        (0, 90, 0.5),  # (90-40)/50 = 1 heat: 1 - 0.5
        (50, 65, 0.5),  # 1 - 0.25 - 0.25
        (0, 20, 1.0),  # colder than 40 C clamps to 0 heat
    ],
)
def test_thermal(util: float, temp: float, expected: float) -> None:
    c = _state(node("a").gpus(1).util(util).temp(temp))
    n = _node(c, "a")
    assert thermal.score(Request(1, 1, 1000, 0, None), n, n.slots) == pytest.approx(expected)


def test_gpu_choice_prefers_nvlink_set_then_lowest_index() -> None:
    # GPU 0 is taken; {1,2} are not linked, {2,3} are: a 2-GPU job gets 2,3 not 1,2.
    s = snap([node("a").gpus(4).alloc(0).nvlink((2, 3))], pending=[job(1, gpus=2)])
    p = plan_cycle(s, now=T0)
    assert p.placements[0].node_gpus == (("a", (2, 3)),)
    # Without links: lowest free indices, gaps allowed (Slurm style): 1,3 when 2 is taken.
    s = snap([node("a").gpus(4).alloc(0).alloc(2)], pending=[job(1, gpus=2)])
    assert plan_cycle(s, now=T0).placements[0].node_gpus == (("a", (1, 3)),)


def test_weighted_sum_packs_small_jobs_and_keeps_empty_node() -> None:
    # Node a: 1 of 8 free (best fit 1.0); node b: empty (0.125). A 1-GPU job goes to a,
    # so b stays whole for the 8-GPU job that follows.
    a = node("a").gpus(8)
    for i in range(7):
        a = a.alloc(i)
    s = snap([a, node("b").gpus(8)], pending=[job(1, gpus=1), job(2, gpus=8)])
    p = plan_cycle(s, now=T0)
    assert p.placement_for(1) is not None and p.placement_for(1).node == "a"  # type: ignore[union-attr]
    assert p.placement_for(2) is not None and p.placement_for(2).node == "b"  # type: ignore[union-attr]


def test_thermal_breaks_ties_between_equal_nodes() -> None:
    # Same fit and topology; a runs hot (90 C: thermal 0.5), b is cool (1.0): b wins.
    s = snap([node("a").gpus(2).temp(90), node("b").gpus(2)], pending=[job(1, gpus=1)])
    assert plan_cycle(s, now=T0).placements[0].node == "b"


def test_topology_weight_decides_between_equally_full_nodes() -> None:
    # Both nodes: 4 GPUs free of 4. a has no NVLink, b is fully linked. 2-GPU job -> b.
    s = snap(
        [node("a").gpus(4), node("b").gpus(4).nvlink((0, 1, 2, 3))],
        pending=[job(1, gpus=2)],
    )
    assert plan_cycle(s, now=T0).placements[0].node == "b"
