"""Property tests: invariants that must hold for any cluster and queue."""

from __future__ import annotations

import os
from datetime import timedelta

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from app.scheduling import (
    JobView,
    Plan,
    PolicySettings,
    RunningJobView,
    Snapshot,
    estimate_start,
    plan_cycle,
)

from .builders import T0, apply, job, node, project, running, snap

# GPUSCHED_PROPERTY_EXAMPLES=2000 for a longer hunt; 150 keeps the suite fast. The suite
# draws the same examples every run (derandomize), so that the gate is deterministic;
# GPUSCHED_PROPERTY_RANDOM=1 hunts with fresh ones (a CI run on 2026-11-26 found a rare
# case of test_backfill_never_delays_the_reserved_head that 4,000 fresh examples did not
# find again: see the closing note of that stop).
PROPS = settings(
    max_examples=int(os.environ.get("GPUSCHED_PROPERTY_EXAMPLES", "150")),
    derandomize=os.environ.get("GPUSCHED_PROPERTY_RANDOM") != "1",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@st.composite
def worlds(draw: st.DrawFn, preemptible: bool = False, with_runtimes: bool = True) -> Snapshot:
    n_nodes = draw(st.integers(1, 4))
    sizes = [draw(st.sampled_from([1, 2, 4, 8])) for _ in range(n_nodes)]
    names = [f"n{i}" for i in range(n_nodes)]
    free: dict[tuple[str, int], int] = {
        (nm, g): 1000 for nm, sz in zip(names, sizes, strict=True) for g in range(sz)
    }
    runs: list[RunningJobView] = []
    next_id = 1000
    projects = ["p", "q", "r"]
    # Running jobs placed consistently (never over-allocated) by construction.
    for _ in range(draw(st.integers(0, 8))):
        nm_i = draw(st.integers(0, n_nodes - 1))
        nm = names[nm_i]
        share = draw(st.sampled_from([1.0, 1.0, 0.5, 0.25]))
        milli = round(share * 1000)
        want = 1 if share < 1 else draw(st.integers(1, sizes[nm_i]))
        gpus = [
            g
            for g in range(sizes[nm_i])
            if free[(nm, g)] >= milli and (milli < 1000 or free[(nm, g)] == 1000)
        ][:want]
        if len(gpus) < want:
            continue
        for g in gpus:
            free[(nm, g)] -= milli
        rt = draw(st.one_of(st.none(), st.integers(60, 20_000))) if with_runtimes else None
        j = job(
            next_id,
            gpus=want,
            gpu_share=share if share < 1 else None,
            estimated_runtime_s=rt,
            project=draw(st.sampled_from(projects)),
            priority=draw(st.integers(0, 3)),
            preemptible=preemptible or draw(st.booleans()),
        )
        runs.append(
            running(
                j,
                {nm: tuple(gpus)},
                started_ago_s=draw(st.sampled_from([30, 5000, 20_000])),
                share=share,
            )
        )
        next_id += 1
    pend: list[JobView] = []
    choice = st.frozensets(st.sampled_from(names), min_size=1, max_size=2)
    for i in range(draw(st.integers(1, 12))):
        pshare: float | None = draw(st.sampled_from([None, None, 0.5, 0.3, 0.7]))
        n_gpus = 1 if pshare is not None else draw(st.integers(0, 9))
        pend.append(
            job(
                i + 1,
                gpus=n_gpus,
                gpu_share=pshare,
                nodes=draw(st.sampled_from([1, 1, 1, 2])) if pshare is None else 1,
                gpu_memory_mb=draw(st.sampled_from([None, None, 20_000, 70_000])),
                estimated_runtime_s=draw(st.one_of(st.none(), st.integers(60, 20_000))),
                max_runtime_s=draw(st.one_of(st.none(), st.integers(600, 20_000))),
                project=draw(st.sampled_from(projects)),
                priority=draw(st.integers(0, 3)),
                preemptible=draw(st.booleans()),
                # Now and then the job's own choice of nodes (only these / never those).
                only_nodes=draw(st.none() | st.none() | st.none() | choice),
                exclude_nodes=draw(st.just(frozenset()) | st.just(frozenset()) | choice),
            )
        )
    builders = [node(nm).gpus(sz) for nm, sz in zip(names, sizes, strict=True)]
    # Occasionally a node or GPU is unusable.
    if draw(st.booleans()):
        builders[0] = builders[0].foreign(0)
    if draw(st.booleans()):
        builders[-1] = builders[-1].unhealthy(0)  # maybe also fully allocated: filters deferred
    if n_nodes > 1 and draw(st.booleans()):
        builders[1] = builders[1].drained()
    if draw(st.booleans()):  # maintenance to come (or begun): only jobs ending by then
        builders[-1] = builders[-1].maintenance(draw(st.sampled_from([-60, 0, 3600, 10_000])))
    quotas = [
        project(p, quota=draw(st.integers(0, 8)), weight=draw(st.sampled_from([1.0, 2.0])))
        for p in projects
    ]
    return snap(builders, pending=pend, running=runs, projects=quotas)


POLICIES = st.sampled_from(["default", "fifo", "priority", "fair-share", "sjf", "las"])


def check_allocation(s: Snapshot, p: Plan) -> None:
    """Sum of shares per GPU <= 1000 and whole GPUs exclusive, after the plan."""
    victims = {x.victim_job_id for x in p.preemptions}
    users: dict[tuple[str, int], list[int]] = {}
    for r in s.running:
        if r.job.id in victims:
            continue
        m = 1000 if r.share >= 1 else round(r.share * 1000)
        for nm, gs in r.placement:
            for g in gs:
                users.setdefault((nm, g), []).append(m)
    jobs = {j.id: j for j in s.pending}
    sizes = {n.name: len(n.gpus) for n in s.nodes}
    for pl in p.placements:
        j = jobs[pl.job_id]
        # gang: exactly `nodes` distinct nodes, each with exactly `gpus` distinct GPUs
        assert len(pl.node_gpus) == max(1, j.nodes)
        assert len({nm for nm, _ in pl.node_gpus}) == len(pl.node_gpus)
        for nm, gs in pl.node_gpus:
            assert len(gs) == j.gpus and len(set(gs)) == len(gs)
            assert all(0 <= g < sizes[nm] for g in gs)
            m = 1000 if pl.share >= 1 else round(pl.share * 1000)
            for g in gs:
                users.setdefault((nm, g), []).append(m)
    views = {(n.name, g.index): (n, g) for n in s.nodes for g in n.gpus}
    j_limits = {j.id: j.max_runtime_s for j in s.pending}
    for pl in p.placements:
        j = jobs[pl.job_id]
        for nm, gs in pl.node_gpus:
            assert nm not in j.exclude_nodes and (j.only_nodes is None or nm in j.only_nodes)
            for g in gs:
                nv, gv = views[(nm, g)]
                assert nv.ready and not nv.drained and gv.healthy and gv.foreign_util_pct < 10
                if nv.maintenance_at is not None:
                    limit = j_limits[pl.job_id]
                    assert limit is not None, (pl, nv)
                    assert T0 + timedelta(seconds=limit) <= nv.maintenance_at, (pl, nv)
    for key, ms in users.items():
        assert sum(ms) <= 1000, key
        if 1000 in ms:
            assert len(ms) == 1, key


@PROPS
@given(worlds(), POLICIES, st.booleans(), st.integers(0, 3))
def test_no_gpu_over_allocated_and_gangs_whole(
    s: Snapshot, policy: str, backfill: bool, seed: int
) -> None:
    cfg = PolicySettings(queue_policy=policy, backfill=backfill)  # type: ignore[arg-type]
    p = plan_cycle(s, now=T0, settings=cfg, seed=seed)
    check_allocation(s, p)
    event(f"placed: {min(len(p.placements), 3)}, preempted: {bool(p.preemptions)}")
    # every pending job is either placed or has exactly one reason
    placed = {pl.job_id for pl in p.placements}
    reasons = [r.job_id for r in p.pending]
    assert len(reasons) == len(set(reasons))
    assert placed | set(reasons) == {j.id for j in s.pending}
    assert not placed & set(reasons)
    # victims are preemptible, running, and old enough
    run = {r.job.id: r for r in s.running}
    for x in p.preemptions:
        r = run[x.victim_job_id]
        assert r.job.preemptible
        assert (T0 - r.started_at).total_seconds() >= PolicySettings().min_run_before_preempt_s


@PROPS
@given(worlds(), st.sampled_from(["fifo", "default", "sjf"]))
def test_backfill_never_delays_the_reserved_head(s: Snapshot, policy: str) -> None:
    cfg = PolicySettings(queue_policy=policy, preemption=False)  # type: ignore[arg-type]
    p = plan_cycle(s, now=T0, settings=cfg)
    heads = [r for r in p.pending if r.estimated_start is not None and "GPUs reserved" in r.message]
    event(f"head reserved: {bool(heads)}")
    event(f"backfilled: {bool(heads) and bool(p.placements)}")
    if not heads:
        return
    (head,) = heads
    head_job = next(j for j in s.pending if j.id == head.job_id)
    after = apply(s, p, T0)
    new_start = estimate_start(after, head_job, now=T0, settings=cfg)
    assert new_start is not None
    assert new_start <= head.estimated_start  # type: ignore[operator]


@PROPS
@given(worlds(preemptible=True), POLICIES)
def test_no_preemption_loop(s: Snapshot, policy: str) -> None:
    """Cycles with no change in between (same `now`): nobody is preempted back."""
    cfg = PolicySettings(queue_policy=policy)  # type: ignore[arg-type]
    pairs: set[tuple[int, int]] = set()
    preempted: set[int] = set()
    for _ in range(6):
        p = plan_cycle(s, now=T0, settings=cfg)
        check_allocation(s, p)
        for x in p.preemptions:
            assert (x.for_job_id, x.victim_job_id) not in pairs, "A -> B -> A loop"
            assert x.victim_job_id not in preempted, "job preempted twice"
            pairs.add((x.victim_job_id, x.for_job_id))
            preempted.add(x.victim_job_id)
        if not p.placements and not p.preemptions:
            break
        s = apply(s, p, T0)
    event(f"preemptions: {min(len(preempted), 3)}")
    # converged: a further cycle changes nothing
    final = plan_cycle(s, now=T0, settings=cfg)
    assert final.preemptions == ()


@PROPS
@given(worlds(), POLICIES, st.booleans())
def test_explain_off_changes_no_decision(s: Snapshot, policy: str, backfill: bool) -> None:
    """The simulator's explain=False fast path must place and preempt exactly the same."""
    on = PolicySettings(queue_policy=policy, backfill=backfill)  # type: ignore[arg-type]
    off = PolicySettings(queue_policy=policy, backfill=backfill, explain=False)  # type: ignore[arg-type]
    a = plan_cycle(s, now=T0, settings=on)
    b = plan_cycle(s, now=T0, settings=off)
    assert a.placements == b.placements
    assert a.preemptions == b.preemptions
    assert a.queue_order == b.queue_order
