"""The default policy over whole replays: waits stay bounded, fair share holds.

Replays rather than single plans: "a job eventually runs" and "a flood does not
raise another team's completion times" are statements about many cycles.
"""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from app.scheduling import PolicySettings
from app.simulator import TraceJob, simulate

EXAMPLES = settings(
    max_examples=int(os.environ.get("GPUSCHED_PROPERTY_EXAMPLES", "24")) // 8 or 1,
    derandomize=os.environ.get("GPUSCHED_PROPERTY_RANDOM") != "1",
    deadline=None,
)
_DEFAULT_RUNTIME_S = PolicySettings().default_runtime_s


def _first_start(runs: list, job_id: str) -> float:  # type: ignore[type-arg]
    return min(r.start_s for r in runs if r.job_id == job_id)


@EXAMPLES
@given(
    short_s=st.integers(600, 1800),
    # Arrivals from one every 2 runtimes (half loaded) to 2 per runtime (2x overload).
    gap_per_runtime=st.sampled_from([0.5, 0.9, 1.0, 2.0]),
    preemptible=st.booleans(),
)
def test_a_long_job_runs_under_a_steady_stream_of_shorter_ones(
    short_s: int, gap_per_runtime: float, preemptible: bool
) -> None:
    """One GPU; a long job arrives right after a short one and then short jobs keep
    arriving, at any rate, for far longer than the bound below. Short-first alone
    (sjf) starts the long job only when the stream stops. The default starts it once
    its deadline (submit + short_first_factor x its expected GPU-time: no history, so
    the default runtime) has passed and the short jobs submitted before then have run:
    a bound that does not grow with the stream."""
    gap = short_s * gap_per_runtime
    # A factor small enough for a short replay: the bound scales with it, for any factor.
    knobs = PolicySettings(short_first_factor=0.02)
    deadline = 1 + knobs.short_first_factor * _DEFAULT_RUNTIME_S
    before = int(deadline / gap) + 2  # short jobs that may still go first
    bound = deadline + (before + 1) * (short_s + 300) + 600
    n = int(3 * bound / gap) + 1  # the stream outlasts the bound three times over
    trace = [TraceJob("long", "u", "v", "long", 1, 1000, 1, 7200, preemptible=preemptible)]
    trace += [
        TraceJob(f"s{i}", "u", "v", "short", 1, 1000, i * gap, short_s, preemptible=preemptible)
        for i in range(n)
    ]
    r = simulate(trace, nodes=1, gpus_per_node=1, policy="default", settings=knobs)
    assert _first_start(r.runs, "long") <= bound


def _team_trace(flood: bool) -> list[TraceJob]:
    # Team b: one 1-GPU hour-long job every hour, a quarter of the 4 GPUs.
    steady = [
        TraceJob(f"b{i}", "ub", "b", "train", 1, 1000, 60 + 3600 * i, 3600) for i in range(12)
    ]
    if not flood:
        return steady
    # Team a floods the queue at time 0 with 400 10-minute jobs: 17 h of the whole cluster.
    burst = [TraceJob(f"a{i}", "ua", "a", "sweep", 1, 1000, 0, 600) for i in range(400)]
    return burst + steady


def test_a_flooding_team_does_not_raise_another_teams_completion_times() -> None:
    """Equal weights: team b asks for less than its half of the GPUs, so a's flood
    may delay b's jobs only until one of a's running jobs ends (10 minutes), not
    behind a's queue. FIFO, for contrast, puts b behind the whole flood."""
    alone = simulate(_team_trace(flood=False), nodes=1, gpus_per_node=4, policy="default")
    flooded = simulate(_team_trace(flood=True), nodes=1, gpus_per_node=4, policy="default")
    fifo = simulate(_team_trace(flood=True), nodes=1, gpus_per_node=4, policy="fifo")
    assert alone.per_vc["b"] == 3600
    assert flooded.per_vc["b"] <= alone.per_vc["b"] + 600
    assert fifo.per_vc["b"] > 5 * alone.per_vc["b"]  # what the flood does without fair share


def test_default_never_preempts_a_non_preemptible_job() -> None:
    """A long non-preemptible job holds its GPU while short preemptible ones queue;
    the same job preemptible is stopped for them (it went past the first LAS queue)."""
    for preemptible in (False, True):
        trace = [TraceJob("long", "u", "v", "long", 1, 1000, 0, 20_000, preemptible=preemptible)]
        trace += [TraceJob(f"s{i}", "u", "v", "s", 1, 1000, 5000 + i, 100) for i in range(3)]
        r = simulate(trace, nodes=1, gpus_per_node=1, policy="default")
        assert (r.preemptions > 0) is preemptible
