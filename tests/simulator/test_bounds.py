"""Lower bounds that count arrivals: hand-computed cases, and no simulated policy below them."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.simulator import TraceJob, simulate
from app.simulator.bounds import BoundJob, avg_jct_bound, makespan_bound, mean_duration

J = BoundJob

# (jobs, GPUs, avg JCT bound, makespan bound), each worked out below.
CASES = [
    # One GPU, three jobs at 0. Fluid least-work-first = SJF: mean busy times 0.5, 2, 4.5;
    # + d/2 -> completions 1, 3, 6 -> avg 10/3 (exactly what SJF gets). Makespan 6.
    pytest.param([J(0, 1, 3), J(0, 1, 1), J(0, 1, 2)], 1, 10 / 3, 6, id="burst-on-one-gpu"),
    # Two GPUs, four 1-GPU 10 s jobs at 0: fluid M = 2.5, 7.5, 12.5, 17.5 (each takes 5 s at
    # 2 GPU-s/s); + 5 each -> 60 / 4 = 15, what two waves of two jobs get. Makespan 40 / 2.
    pytest.param([J(0, 1, 10)] * 4, 2, 15, 20, id="two-waves"),
    # Two GPUs, two 1-GPU jobs: the busy-time bound (M 2.5, 7.5 + 5 each = 10) equals the
    # mean duration; both run at once. Makespan 10.
    pytest.param([J(0, 1, 10), J(0, 1, 10)], 2, 10, 10, id="side-by-side"),
    # No overlap: each job alone, the bound is the mean duration. Makespan 100 + 10.
    pytest.param([J(0, 1, 10), J(100, 1, 10)], 1, 10, 110, id="apart"),
    # A job with no work ends as it arrives (JCT 0); the other one: M = 5 + 5 = 10.
    # avg = (0 + 10) / 2 = 5 = mean duration. Makespan 10.
    pytest.param([J(0, 1, 0), J(0, 1, 10)], 1, 5, 10, id="no-work"),
    # Half a GPU for 10 s each, two jobs on one GPU: work 5 each. Fluid M = 2.5, 7.5; + 5
    # -> completions 7.5 and 12.5 -> 10 = mean duration (sharing, both end at 10). Makespan
    # max(10, 10 / 1) = 10.
    pytest.param([J(0, 0.5, 10), J(0, 0.5, 10)], 1, 10, 10, id="shares"),
    # A late burst: a 1 s job at 0, then four 10 s jobs at 100 on 2 GPUs. The early job:
    # fluid M = 0.25 (at 2 GPU-s/s), + 0.5 -> 0.75 (below its duration: the relaxation
    # lets it run wider); the burst 15 each as in two-waves -> (0.75 + 60) / 5 = 12.15,
    # above the mean duration 8.2. Makespan: 100 + 40 / 2.
    pytest.param([J(0, 1, 1)] + [J(100, 1, 10)] * 4, 2, 12.15, 120, id="late-burst"),
]


@pytest.mark.parametrize(("jobs", "gpus", "avg_jct", "makespan"), CASES)
def test_hand_computed_bounds(
    jobs: list[BoundJob], gpus: int, avg_jct: float, makespan: float
) -> None:
    assert avg_jct_bound(jobs, gpus) == pytest.approx(avg_jct)
    assert makespan_bound(jobs, gpus) == pytest.approx(makespan)
    assert avg_jct_bound(jobs, gpus) >= mean_duration(jobs)


@pytest.mark.parametrize("gpus", [3, 7, 24])
def test_float_leftovers_end(gpus: int) -> None:
    # Late arrivals (times near 6.5e6 s) with fractional GPUs: the first version subtracted
    # each stretch's work and waited for the rest to reach 0, which a remainder below the
    # clock's resolution never did (an endless loop on philly_ed69ec, 3 x 8 GPUs).
    jobs = [J(1e6, 0.3, 7), J(6_500_000.548798761, 0.25, 8646.758972824831)]
    assert avg_jct_bound(jobs, gpus) == pytest.approx(mean_duration(jobs))


def test_empty_and_bad_input() -> None:
    assert avg_jct_bound([], 8) == 0.0 and makespan_bound([], 8) == 0.0
    with pytest.raises(ValueError, match="total_gpus"):
        avg_jct_bound([J(0, 1, 1)], 0)
    with pytest.raises(ValueError, match="total_gpus"):
        makespan_bound([J(0, 1, 1)], 0)


def test_simulator_reports_them() -> None:
    # The late-burst case through the simulator, 1 node x 2 GPUs. FIFO: the early job 1 s,
    # the burst in two waves (10, 10, 20, 20) -> 61 / 5, just above the bound.
    trace = [TraceJob("a", "u", "v", "x", 1, 1000, 0, 1)]
    trace += [TraceJob(f"b{i}", "u", "v", "x", 1, 1000, 100, 10) for i in range(4)]
    r = simulate(trace, nodes=1, gpus_per_node=2, policy="fifo")
    assert r.lower_bounds == {
        "avg_jct_s": pytest.approx(41 / 5),
        "makespan_s": pytest.approx(20.5),
        "avg_jct_s_with_arrivals": pytest.approx(12.15),
        "makespan_s_with_arrivals": pytest.approx(120.0),
    }
    assert r.avg_jct_s == pytest.approx(61 / 5) and r.makespan_s == pytest.approx(120.0)
    # As table rows: queueing is the JCT bound over the mean duration; utilisation what
    # the 41 GPU-s of work on 2 GPUs (20.5 s) give over each makespan bound.
    plain, arrivals = r.bound_rows()
    assert plain == pytest.approx((41 / 5, 0.0, 20.5, 1.0))
    assert arrivals == pytest.approx((12.15, 12.15 - 41 / 5, 120.0, 20.5 / 120))


PROPS = settings(
    max_examples=int(os.environ.get("GPUSCHED_PROPERTY_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@st.composite
def traces(draw: st.DrawFn) -> list[TraceJob]:
    out = []
    for i in range(draw(st.integers(1, 14))):
        gpus = draw(st.sampled_from([1, 1, 2, 4]))
        milli = draw(st.sampled_from([1000, 1000, 500, 250])) if gpus == 1 else 1000
        submit = draw(st.integers(0, 400))
        duration = draw(st.integers(0, 300))
        name = draw(st.sampled_from(["a", "b"]))
        out.append(
            TraceJob(
                f"j{i}", "u", draw(st.sampled_from(["v", "w"])), name, gpus, milli, submit, duration
            )
        )
    return sorted(out, key=lambda j: j.submit_time)


@PROPS
@given(trace=traces(), gpus_per_node=st.sampled_from([2, 4]), nodes=st.integers(1, 2))
def test_no_policy_beats_the_bounds(trace: list[TraceJob], gpus_per_node: int, nodes: int) -> None:
    """Every policy, clairvoyant SJF and preempting LAS included, stays at or above both
    bounds: they hold for any schedule."""
    for policy, exact in (("fifo", False), ("default", False), ("las", False), ("sjf", True)):
        r = simulate(
            trace, nodes=nodes, gpus_per_node=gpus_per_node, policy=policy, exact_runtimes=exact
        )
        if not r.jobs:
            continue
        lb = r.lower_bounds
        assert r.avg_jct_s >= lb["avg_jct_s_with_arrivals"] - 1e-6 >= lb["avg_jct_s"] - 2e-6
        assert r.makespan_s >= lb["makespan_s_with_arrivals"] - 1e-6 >= lb["makespan_s"] - 2e-6
