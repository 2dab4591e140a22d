"""What preemption costs, which jobs may be preempted, and fragmentation of shared GPUs."""

from __future__ import annotations

import random
from collections import Counter
from datetime import datetime
from typing import Any

import pytest

from app.scheduling import Plan, Snapshot
from app.simulator import SimResult, TraceJob, engine, simulate
from app.simulator.trace import mark_preemptible


def tj(i: int, gpus: int, submit: float, duration: float, milli: int = 1000) -> TraceJob:
    return TraceJob(f"j{i}", "u", "v", f"n{i % 3}", gpus, milli, submit, duration)


def busy_trace(n: int = 80, seed: int = 5) -> list[TraceJob]:
    """Dense arrivals of long and short jobs on a few GPUs: LAS preempts often."""
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(1 / 400)
        long = rng.random() < 0.3
        duration = rng.uniform(8000, 30000) if long else rng.uniform(60, 2000)
        out.append(tj(i, rng.choice((1, 1, 2)), round(t), round(duration)))
    return out


def gpu_seconds_run(result: SimResult) -> float:
    return sum((r.end_s - r.start_s) * r.gpus for r in result.runs)


@pytest.mark.parametrize("policy", ["las", "fifo", "default", "sjf"])
@pytest.mark.parametrize("cost", [0.0, 300.0, 1200.0])
def test_every_preemption_adds_its_cost_in_gpu_time(policy: str, cost: float) -> None:
    trace = busy_trace()
    r = simulate(trace, nodes=1, gpus_per_node=4, policy=policy, preemption_cost_s=cost)
    work = sum(j.gpu_num * j.duration for j in trace)
    stops = Counter(run.job_id for run in r.runs)
    gpus = {j.job_id: j.gpu_num for j in trace}
    # Each stop before a job's last run cost it `cost` seconds on all its GPUs.
    lost = sum((count - 1) * cost * gpus[job_id] for job_id, count in stops.items())
    assert sum(count - 1 for count in stops.values()) == r.preemptions
    assert r.preemption_lost_gpu_h == pytest.approx(lost / 3600)
    assert gpu_seconds_run(r) == pytest.approx(work + lost)
    assert r.preemption_cost_s == cost
    if policy == "las":
        assert r.preemptions > 10  # the trace does exercise preemption
    # Waiting time is what a job did not run: JCT minus its duration and restarts.
    durations = {j.job_id: j.duration for j in trace}
    ran = sum(durations[job_id] + (count - 1) * cost for job_id, count in stops.items())
    assert r.avg_queue_s == pytest.approx((sum(r.jcts) - ran) / len(trace))


def test_a_costlier_preemption_lengthens_the_preempted_jobs() -> None:
    trace = busy_trace()
    cheap = simulate(trace, nodes=1, gpus_per_node=4, policy="las", preemption_cost_s=0)
    dear = simulate(trace, nodes=1, gpus_per_node=4, policy="las", preemption_cost_s=1800)
    assert dear.preemption_lost_gpu_h > 0 and cheap.preemption_lost_gpu_h == 0
    assert dear.avg_jct_s > cheap.avg_jct_s


def test_a_job_not_preemptible_is_never_preempted() -> None:
    # As the LAS hand case (test_simulator): j0 would be stopped for j1 at 5000.
    trace = [tj(0, 1, 0, 10_000), tj(1, 1, 5000, 100)]
    r = simulate(
        mark_preemptible(trace, fraction=0, seed=0), nodes=1, gpus_per_node=1, policy="las"
    )
    assert r.preemptions == 0 and r.preemptible_jobs == 0
    assert sorted(r.jcts) == [5100, 10_000]


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_only_the_drawn_jobs_are_preempted(fraction: float) -> None:
    trace = mark_preemptible(busy_trace(120), fraction=fraction, seed=2)
    r = simulate(trace, nodes=1, gpus_per_node=4, policy="las")
    preemptible = {j.job_id for j in trace if j.preemptible}
    assert r.preemptible_jobs == len(preemptible) == round(fraction * 120)
    stopped = {
        job_id for job_id, count in Counter(run.job_id for run in r.runs).items() if count > 1
    }
    assert stopped <= preemptible
    assert bool(stopped) == (fraction > 0)


def test_fragmentation_by_hand() -> None:
    # One GPU, FIFO. A (a quarter GPU) runs 0..100; C (a whole GPU) waits until A ends
    # and runs 100..200. While A runs, 750 of 1000 is free on a partly used GPU, and of
    # the run's two jobs one (C) asks more than that: 0.75 x 1/2 = 0.375 GPUs are
    # fragments for 100 of the 200 s of makespan -> 0.1875.
    trace = [tj(0, 1, 0, 100, milli=250), tj(1, 1, 0, 100)]
    r = simulate(trace, nodes=1, gpus_per_node=1, policy="fifo")
    assert sorted(r.jcts) == [100, 200]
    assert r.fragmentation == pytest.approx(0.375 * 100 / 200)
    # Add B (half a GPU) beside A: 250 free, which B (500) and C (1000) could not use,
    # 2 of 3 jobs: 0.25 x 2/3 GPUs for 100 of 200 s.
    trace = [tj(0, 1, 0, 100, milli=250), tj(1, 1, 0, 100, milli=500), tj(2, 1, 0, 100)]
    r = simulate(trace, nodes=1, gpus_per_node=1, policy="fifo")
    assert sorted(r.jcts) == [100, 100, 200]
    assert r.fragmentation == pytest.approx(0.25 * 2 / 3 * 100 / 200)


def test_whole_gpus_leave_no_fragments() -> None:
    r = simulate(busy_trace(), nodes=1, gpus_per_node=4, policy="las")
    assert r.fragmentation == 0


@pytest.mark.parametrize(
    ("policy", "fraction", "asked"),
    [
        ("default", 1, True),  # it may preempt (for priority today, for more later)
        ("priority", 1, True),
        ("las", 1, True),
        ("default", 0, False),  # nothing running may be preempted
        ("las", 0, False),
        ("fifo", 1, False),  # preempts only for quotas, which replays do not have
        ("sjf", 1, False),
        ("fair-share", 1, False),
    ],
)
def test_an_arrival_into_a_full_cluster_is_planned_when_a_preemption_could_follow(
    monkeypatch: pytest.MonkeyPatch, policy: str, fraction: float, asked: bool
) -> None:
    # One GPU, held by j0 from 0 to 10,000 s; j1 arrives at 5,000 into the full cluster.
    plan_times: list[float] = []
    plan = engine.plan_cycle

    def spy(snapshot: Snapshot, *, now: datetime, **kwargs: Any) -> Plan:
        plan_times.append((now - engine.SIM_EPOCH).total_seconds())
        return plan(snapshot, now=now, **kwargs)

    monkeypatch.setattr(engine, "plan_cycle", spy)
    trace = mark_preemptible([tj(0, 1, 0, 10_000), tj(1, 1, 5000, 100)], fraction=fraction, seed=0)
    simulate(trace, nodes=1, gpus_per_node=1, policy=policy, preemption_cost_s=0)
    assert (5000 in plan_times) is asked
