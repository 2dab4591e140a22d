"""The queue order kept between cycles (`KeptOrder`, issue 35 point 3) is the order
sorted from scratch, for every policy, whatever came and went: the plans do not depend
on it."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from app.scheduling import QUEUE_POLICIES, JobView, KeptOrder, PolicySettings, plan_cycle
from app.scheduling.queue import _SORTS, order_jobs

from .builders import T0, apply, job, node, project, snap
from .test_properties import PROPS

History = dict[tuple[str, str], tuple[float, ...]]
Cycle = tuple[list[JobView], History, PolicySettings]
POLICIES = st.sampled_from(QUEUE_POLICIES)


@st.composite
def _view(draw: st.DrawFn, jid: int) -> JobView:
    attained = draw(st.sampled_from([0.0, 0.0, 0.0, 600.0, 50_000.0]))
    return job(
        jid,
        name=draw(st.sampled_from(["train", "eval"])),
        user=draw(st.sampled_from(["ann", "bob"])),
        project=draw(st.sampled_from(["p", "q"])),
        gpus=draw(st.sampled_from([1, 2])),
        priority=draw(st.sampled_from([0, 0, 1])),
        submitted_at=T0 + timedelta(seconds=draw(st.sampled_from([0, 60, 120]))),
        estimated_runtime_s=draw(st.sampled_from([None, None, 60, 600])),
        max_runtime_s=draw(st.sampled_from([None, 3600])),
        attained_gpu_s=attained,
        last_preempted_at=T0 + timedelta(seconds=200) if attained else None,
    )


@st.composite
def _cycles(draw: st.DrawFn, policy: str) -> list[Cycle]:
    """Cycles of one queue: jobs come, go, come back changed; predictions move; settings
    change. Each cycle's history is its own copy (`_in_place` plays them as the simulator
    keeps its history: one dict changed in place)."""
    views: dict[int, JobView] = {}
    history: History = {}
    cycles: list[Cycle] = []
    # Mostly the policy's settings, now and then others (the kept order starts again).
    usual = PolicySettings(queue_policy=policy)  # type: ignore[arg-type]
    other = (
        PolicySettings(queue_policy=policy, short_first_factor=0.25),  # type: ignore[arg-type]
        PolicySettings(queue_policy=draw(POLICIES)),  # type: ignore[arg-type]
    )
    for _ in range(draw(st.integers(1, 8))):
        waiting = draw(st.sets(st.integers(1, 24), max_size=24))
        for jid in waiting:
            if jid not in views or draw(st.integers(0, 4)) == 0:
                views[jid] = draw(_view(jid))
        if draw(st.booleans()):
            key = (draw(st.sampled_from(["ann", "bob"])), draw(st.sampled_from(["train", "eval"])))
            history[key] = (*history.get(key, ()), float(draw(st.sampled_from([30, 900]))))
        jobs = draw(st.permutations([views[jid] for jid in sorted(waiting)]))
        settings = draw(st.sampled_from([usual, usual, usual, *other]))
        cycles.append((jobs, dict(history), settings))
    return cycles


def _in_place(cycles: list[Cycle]) -> Iterator[Cycle]:
    history: History = {}
    for jobs, then, settings in cycles:
        history.clear()
        history.update(then)
        yield jobs, history, settings


def _ids(jobs: list[JobView]) -> list[int]:
    return [j.id for j in jobs]


@PROPS
@given(POLICIES.flatmap(_cycles))
def test_kept_order_is_the_sort_from_scratch(cycles: list[Cycle]) -> None:
    memo = KeptOrder()
    for jobs, history, settings in _in_place(cycles):
        kept = memo.order(jobs, history, settings)
        assert _ids(kept) == _ids(_SORTS[settings.queue_policy](jobs, history, settings))
        # This cycle's views, never a kept one of the same job that has changed since.
        assert sorted(map(id, kept)) == sorted(map(id, jobs))


@PROPS
@given(POLICIES.flatmap(_cycles), st.integers(0, 4))
def test_every_policy_orders_the_same_with_the_memo(cycles: list[Cycle], minutes: int) -> None:
    """Fair share between projects, and for the default policy its tiers and LAS queues
    (promotion by the clock included), over the kept order: the same with the memo."""
    memo = KeptOrder()
    projects = {"p": project("p", usage=3600.0), "q": project("q", weight=2.0)}
    for n, (jobs, history, settings) in enumerate(_in_place(cycles)):
        now = T0 + timedelta(minutes=minutes * n)
        args = {"settings": settings, "projects": projects, "running": (), "history": history}
        with_memo = order_jobs(jobs, now=now, memo=memo, **args)  # type: ignore[arg-type]
        assert _ids(with_memo) == _ids(order_jobs(jobs, now=now, **args))  # type: ignore[arg-type]


def test_a_queue_kept_across_cycles_plans_as_from_scratch() -> None:
    """Through `plan_cycle`: jobs start, end and arrive, and each plan with the memo is
    the plan without it."""
    memo = KeptOrder()
    # As the simulator plans: the nodes' telemetry is never stale, however time moves.
    settings = PolicySettings(telemetry_max_age_s=math.inf, stability_window_s=0.0)
    nodes = [node("a").gpus(4), node("b").gpus(4)]
    arrivals = [
        job(i, gpus=1 + i % 4, estimated_runtime_s=600 * (1 + i % 5), project="pq"[i % 2])
        for i in range(1, 41)
    ]
    s = snap(nodes, pending=arrivals[:20])
    now = T0
    placed = 0
    for step in range(6):
        with_memo = plan_cycle(s, now=now, settings=settings, memo=memo)
        assert with_memo == plan_cycle(s, now=now, settings=settings)
        placed += len(with_memo.placements)
        now += timedelta(minutes=10)
        s = apply(s, with_memo, now)
        # The jobs of one project end; four more jobs arrive.
        running = [r for r in s.running if r.job.project != "pq"[step % 2]]
        arriving = arrivals[20 + 4 * step : 24 + 4 * step]
        s = snap(nodes, pending=[*s.pending, *arriving], running=running)
    assert placed > 8  # the queue moved: the memo saw jobs leave and arrive


def test_a_changed_view_takes_its_new_place() -> None:
    """A job requeued with service (a new view of the same id) moves to its new deadline."""
    memo = KeptOrder()
    settings = PolicySettings()
    a, b = job(1, estimated_runtime_s=600), job(2, estimated_runtime_s=3000)
    assert _ids(memo.order([a, b], {}, settings)) == [1, 2]
    b_served = replace(b, attained_gpu_s=2900.0)  # 100 s left against a's 600
    assert _ids(memo.order([a, b_served], {}, settings)) == [2, 1]
