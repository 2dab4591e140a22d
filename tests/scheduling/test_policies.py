"""Queue order policies: case tables of jobs and the order each policy gives."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.scheduling import PolicySettings, decay_usage, order_jobs, plan_cycle, predict_runtime
from app.scheduling.queue import _seconds, las_level
from app.scheduling.types import JobView

from .builders import T0, job, node, project, running, snap


def _order(policy: str, jobs, projects=(), running_=(), history=None, **kw) -> list[int]:  # type: ignore[no-untyped-def]
    out = order_jobs(
        jobs,
        settings=PolicySettings(queue_policy=policy, **kw),  # type: ignore[arg-type]
        projects={p.name: p for p in projects},
        running=running_,
        history=history or {},
        now=T0,
    )
    return [j.id for j in out]


JOBS = [
    job(1, priority=0, project="a", estimated_runtime_s=600, gpus=1),
    job(2, priority=5, project="a", estimated_runtime_s=60, gpus=1),
    job(3, priority=0, project="b", estimated_runtime_s=6000, gpus=1),
    job(4, priority=5, project="b", estimated_runtime_s=60, gpus=4, attained_gpu_s=50_000),
]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("fifo", [1, 2, 3, 4]),  # submit order
        ("priority", [2, 4, 1, 3]),  # priority 5 first, FIFO inside
        # sjf by GPU-time: 2 = 60, 4 = 240, 1 = 600, 3 = 6000
        ("sjf", [2, 4, 1, 3]),
        # las: 4 attained 50,000 GPU-s >= 36,000 -> queue 2; others queue 0 (FIFO)
        ("las", [1, 2, 3, 4]),
    ],
)
def test_simple_orders(policy: str, expected: list[int]) -> None:
    assert _order(policy, JOBS) == expected


def test_fair_share_interleaves_by_weighted_usage() -> None:
    # a used 10 GPU-h, b used nothing: b goes first. Each job charges 1 GPU x 3600 s.
    # keys: a=36000, b=0 -> b(3) ; b=3600 -> b(5); a=36000 vs b=7200 -> b(6) ...
    jobs = [
        job(1, project="a"),
        job(2, project="a"),
        job(3, project="b"),
        job(5, project="b"),
        job(6, project="b"),
    ]
    projects = [project("a", usage=36_000), project("b", usage=0)]
    # b: 0 -> 3600 -> 7200 -> 10800 (all 3 jobs); then a's jobs.
    assert _order("fair-share", jobs, projects) == [3, 5, 6, 1, 2]


def test_fair_share_weight_doubles_the_share() -> None:
    # equal usage 0; a has weight 2 so each a job costs half: a,a,b? key(a)=0, key(b)=0 tie by
    # name: a (now 1800), b (now 3600), a (3600 vs 3600 tie -> a), a (5400) ...
    jobs = [job(i, project="a") for i in range(1, 5)] + [job(i, project="b") for i in range(5, 9)]
    projects = [project("a", weight=2.0), project("b", weight=1.0)]
    order = _order("fair-share", jobs, projects)
    first_six = order[:6]
    assert sum(1 for i in first_six if i <= 4) == 4  # a gets 4 of the first 6 slots
    assert order[:3] == [1, 5, 2]


def test_fair_share_counts_running_jobs() -> None:
    # a has 4 GPUs running (charged 4 x 3600) and no past usage; b none: b first.
    jobs = [job(1, project="a"), job(2, project="b")]
    r = running(job(9, project="a", gpus=4), {"n": (0, 1, 2, 3)})
    assert _order("fair-share", jobs, [project("a"), project("b")], [r]) == [2, 1]


def test_default_is_priority_tiers_then_fair_share() -> None:
    jobs = [
        job(1, project="a", priority=1),
        job(2, project="a", priority=1),
        job(3, project="b", priority=1),
        job(4, project="b", priority=9),
    ]
    projects = [project("a", usage=0), project("b", usage=100_000)]
    # tier 9: job 4. tier 1: a (0) before b (100000 + 3600 charged by job 4) -> 1, 2, 3
    assert _order("default", jobs, projects) == [4, 1, 2, 3]


def _waited(hours: float) -> dict[str, object]:
    return {"submitted_at": T0 - timedelta(hours=hours)}


@pytest.mark.parametrize(
    ("jobs", "expected"),
    [
        # One project: earliest deadline = submitted + 0.25 x expected GPU-time. 2 = 1 GPU
        # x 1 h (15 min), 1 = 8 GPUs x 1 h (2 h): 2 first though submitted later.
        ([job(1, gpus=8, estimated_runtime_s=3600), job(2, estimated_runtime_s=3600)], [2, 1]),
        # Job 1 (8 GPUs x 10 h = 80 GPU-h) waited 24 h: deadline -24 h + 20 h = -4 h, before
        # job 2's (1 GPU x 1 h, fresh: +15 min) -> 1 first.
        (
            [
                job(1, gpus=8, estimated_runtime_s=36_000, **_waited(24)),
                job(2, estimated_runtime_s=3600, **_waited(0)),
            ],
            [1, 2],
        ),
        # The same job 1 after 18 h only: -18 h + 20 h = +2 h, after job 2 -> 2 first.
        (
            [
                job(1, gpus=8, estimated_runtime_s=36_000, **_waited(18)),
                job(2, estimated_runtime_s=3600, **_waited(0)),
            ],
            [2, 1],
        ),
        # What a job already ran counts off its size: job 1 (1 GPU x 10 h, 9.5 h done,
        # in LAS queue 1 but promoted: waited 40 h >= 4 x 9.5 h) has 30 min left.
        (
            [
                job(
                    1,
                    estimated_runtime_s=36_000,
                    attained_gpu_s=34_200,
                    last_preempted_at=T0 - timedelta(hours=40),
                    **_waited(50),
                ),
                job(2, estimated_runtime_s=7200, **_waited(0)),
            ],
            [1, 2],
        ),
        # Equal expected size (no estimate, no history: default 24 h): FIFO.
        ([job(1), job(2), job(3)], [1, 2, 3]),
        # Equal deadlines (one submit time, one size), read out of order: by id.
        ([job(3, submitted_at=T0), job(1, submitted_at=T0), job(2, submitted_at=T0)], [1, 2, 3]),
    ],
)
def test_default_orders_by_deadline_in_a_project(jobs: list[JobView], expected: list[int]) -> None:
    assert _order("default", jobs, short_first_factor=0.25, promote_after_service=4) == expected


def test_default_factor_zero_is_fifo_in_a_queue() -> None:
    jobs = [job(1, gpus=8, estimated_runtime_s=36_000), job(2, estimated_runtime_s=60)]
    assert _order("default", jobs, short_first_factor=0) == [1, 2]


def _preempted(id: int, attained: float, hours_ago: float) -> JobView:
    return job(
        id,
        attained_gpu_s=attained,
        last_preempted_at=T0 - timedelta(hours=hours_ago),
        estimated_runtime_s=60,
        **_waited(100),
    )


def test_default_las_queues_and_promotion_relative_to_service() -> None:
    # Job 1 ran 2 GPU-h (LAS queue 1), preempted 7 h ago: behind the fresh, longer job 2.
    # At 8 h (4 x its 2 h of service) it is promoted to queue 0, and its earlier
    # deadline puts it first.
    fresh = job(2, estimated_runtime_s=36_000, **_waited(0))
    knobs = {"short_first_factor": 0.25, "promote_after_service": 4}
    assert _order("default", [_preempted(1, 7200, 7), fresh], **knobs) == [2, 1]
    assert _order("default", [_preempted(1, 7200, 8), fresh], **knobs) == [1, 2]
    # Service counts per GPU: 4 GPUs x 2 h is 2 h of service too.
    four = replace(_preempted(1, 4 * 7200, 8), gpus=4)
    assert _order("default", [four, fresh], **knobs) == [1, 2]
    # 0: never promoted.
    assert _order("default", [_preempted(1, 7200, 800), fresh], promote_after_service=0) == [
        2,
        1,
    ]


def test_default_absolute_guard_is_off_unless_set() -> None:
    # A job pending 10 days (1 GPU x 24 h by default) against a fresh short one: the
    # deadline decides by default; the optional absolute guard puts the old job first.
    old, short = job(1, **_waited(240)), job(2, estimated_runtime_s=60, **_waited(0))
    projects = [project("a", usage=0)]
    assert PolicySettings().starvation_after_s == 0
    assert _order("default", [old, short], projects, short_first_factor=100) == [2, 1]
    assert _order(
        "default", [old, short], projects, short_first_factor=100, starvation_after_s=86400
    ) == [1, 2]


def test_default_starving_job_goes_ahead_of_fair_share() -> None:
    # a used 100 GPU-h, b nothing: fair share puts b's fresh job first, unless a's job
    # has waited the (optional) absolute starvation limit.
    projects = [project("a", usage=360_000), project("b", usage=0)]
    fresh_b = job(2, project="b", **_waited(0))
    day = {"starvation_after_s": 86400}
    assert _order("default", [job(1, project="a", **_waited(23)), fresh_b], projects, **day) == [
        2,
        1,
    ]
    assert _order("default", [job(1, project="a", **_waited(24)), fresh_b], projects, **day) == [
        1,
        2,
    ]
    # Off (0, the default): fair share decides however long a job waited.
    starving_a = job(1, project="a", **_waited(240))
    assert _order("default", [starving_a, fresh_b], projects) == [2, 1]


def test_default_limit_longer_than_time_itself_means_never() -> None:
    # No date arithmetic overflow; nobody starves, so size decides (job 2 is shorter).
    jobs = [job(1, gpus=8, **_waited(1)), job(2, **_waited(0))]
    assert _order("default", jobs, starvation_after_s=1e300) == [2, 1]


def test_default_priority_tier_beats_starvation() -> None:
    jobs = [job(1, **_waited(48)), job(2, priority=1, **_waited(0))]
    assert _order("default", jobs, starvation_after_s=86400) == [2, 1]


def test_default_predicts_runtime_from_history() -> None:
    jobs = [job(1, name="big", user="u"), job(2, name="small", user="u")]
    history = {("u", "big"): (5000.0, 7000.0, 6000.0), ("u", "small"): (10.0, 30.0)}
    assert _order("default", jobs, history=history) == [2, 1]


def test_sjf_uses_history_prediction_when_no_estimate() -> None:
    jobs = [job(1, name="big", user="u"), job(2, name="small", user="u")]
    history = {("u", "big"): (5000.0, 7000.0, 6000.0), ("u", "small"): (10.0, 30.0)}
    assert _order("sjf", jobs, history=history) == [2, 1]


@pytest.mark.parametrize(
    ("runs", "expected"),
    [((), None), ((100.0,), 100.0), ((100.0, 300.0, 200.0), 200.0), ((1.0, 2.0, 3.0, 100.0), 2.5)],
)
def test_predict_runtime_is_median(runs: tuple[float, ...], expected: float | None) -> None:
    history = {("u", "train"): runs} if runs else {}
    assert predict_runtime(history, job(1, user="u", name="train")) == expected


@pytest.mark.parametrize(
    ("usage", "elapsed", "half_life", "expected"),
    [(100.0, 0, 10, 100.0), (100.0, 10, 10, 50.0), (100.0, 20, 10, 25.0), (100.0, 5, 0, 0.0)],
)
def test_decay_usage(usage: float, elapsed: float, half_life: float, expected: float) -> None:
    assert decay_usage(usage, elapsed, half_life) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("attained", "level"), [(0, 0), (3599, 0), (3600, 1), (35_999, 1), (36_000, 2)]
)
def test_las_levels(attained: float, level: int) -> None:
    assert las_level(attained, PolicySettings()) == level


def test_queue_positions_follow_policy_order() -> None:
    s = snap([node("a").gpus(1).alloc(0)], pending=JOBS)
    p = plan_cycle(s, now=T0, settings=PolicySettings(queue_policy="priority"))
    assert p.queue_order == (2, 4, 1, 3)
    assert {r.job_id: r.queue_position for r in p.pending} == {2: 1, 4: 2, 1: 3, 3: 4}


def test_unknown_policy_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown queue policy"):
        _order("random", JOBS)


def test_submitted_at_none_sorts_first() -> None:
    jobs = [job(1), job(2, submitted_at=None), job(3, submitted_at=T0 - timedelta(days=1))]
    assert _order("fifo", jobs) == [2, 3, 1]


_EXACT = timedelta(microseconds=2**53 - 1)  # about 285 years


@given(st.timedeltas(min_value=-_EXACT, max_value=_EXACT))
def test_seconds_equals_total_seconds_exactly(span: timedelta) -> None:
    # sjf's aging uses it instead of total_seconds(): the same float, or orders would move.
    assert _seconds(span) == span.total_seconds()
