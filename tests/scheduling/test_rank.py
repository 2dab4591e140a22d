"""Why a waiting job is where it is (as sprio): each job ahead counted by the first rule of
the policy that puts it first. The order is the core's own (`order_jobs`)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from app.scheduling.queue import order_jobs
from app.scheduling.rank import RankClasses, ahead_of, rank_all, rank_keys, rank_of
from tests.scheduling.builders import T0, job, project, settings

HOUR = 3600.0
PROJECTS = {p.name: p for p in (project("ml"), project("cv", usage=1e9))}


def _rank(policy: str, jobs, asked: int, **kw):
    policy_settings = settings(queue_policy=policy, **kw)
    order = order_jobs(
        jobs, settings=policy_settings, projects=PROJECTS, running=(), history={}, now=T0
    )
    return rank_of(order, asked, settings=policy_settings, history={}, now=T0)


# Job 9 (ml, priority 0, 1 GPU, 2 h estimate, waited ~1 h) against one other job each.
ASKED = job(9, project="ml", estimated_runtime_s=7200)


@pytest.mark.parametrize(
    ("policy", "other", "because"),
    [
        ("default", job(1, priority=5), "priority"),
        # (No "starving" case: the default's absolute guard is off unless set, issue 41.)
        # Another project's turn comes first here (ml and the other start even: cv's usage
        # only matters against ml's own charge).
        ("default", job(1, project="ab", estimated_runtime_s=99 * 3600), "fair_share"),
        ("default", job(1, project="ml", estimated_runtime_s=3600), "shorter"),  # 1 < 2 GPU-h
        # Ahead by its waiting alone (the default's key shrinks as a job waits): earlier.
        ("default", job(1, project="ml", estimated_runtime_s=7200), "earlier"),
        ("fifo", job(1, priority=-5), "earlier"),
        ("priority", job(1, priority=1), "priority"),
        ("priority", job(1), "earlier"),
        ("sjf", job(1, estimated_runtime_s=60), "shorter"),
        ("las", job(1, attained_gpu_s=0.0), "earlier"),
        ("fair-share", job(1, project="ab"), "fair_share"),
        ("fair-share", job(1, project="ml", priority=3), "priority"),
    ],
)  # fmt: skip
def test_each_job_ahead_is_counted_by_the_rule_that_puts_it_first(policy, other, because):
    ranked = _rank(policy, [ASKED, other], ASKED.id)
    assert ranked is not None
    assert (ranked.position, ranked.waiting, ranked.ahead) == (2, 2, ((because, 1),))


def test_las_counts_less_service_and_the_job_behind_is_not_counted():
    served = job(9, attained_gpu_s=5 * HOUR)  # past the first threshold (1 GPU-h)
    ranked = _rank("las", [served, job(1), job(2, attained_gpu_s=20 * HOUR)], 9)
    assert ranked is not None
    assert (ranked.position, ranked.ahead) == (2, (("less_service", 1),))


def test_the_default_names_the_las_queue_and_counts_jobs_of_earlier_queues():
    # Job 9 received 5 GPU-h (LAS queue 1; not promoted: it waited 1 h, under 4 x 5 h).
    # A fresh 99 h job of another project is in queue 0: ahead by less service, not by
    # fair share or size; a fresh job behind it in its own queue is not counted.
    served = job(9, project="ml", estimated_runtime_s=7200, attained_gpu_s=5 * HOUR)
    fresh = job(1, project="ab", estimated_runtime_s=99 * 3600)
    ranked = _rank("default", [served, fresh, job(2, project="ml", attained_gpu_s=9 * HOUR)], 9)
    assert ranked is not None
    assert (ranked.position, ranked.ahead, ranked.las_queue) == (2, (("less_service", 1),), 1)
    assert ranked.message == (
        "2 of 3 waiting; ahead of it: 1 by an earlier LAS queue: less GPU-time received so "
        "far, or promoted; it is in LAS queue 1 (0: least GPU-time received)"
    )
    # Promoted (waited 4 x its service since it was preempted): back in queue 0.
    promoted = job(
        9, project="ml", attained_gpu_s=HOUR * 1.5, last_preempted_at=T0 - timedelta(hours=7)
    )
    first = _rank("default", [promoted], 9)
    assert first is not None
    assert (first.las_queue, first.message) == (0, "1 of 1 waiting: first in line (LAS queue 0)")
    # Policies without LAS queues name none.
    assert _rank("fifo", [served], 9).las_queue is None  # type: ignore[union-attr]


def test_a_mixed_queue_is_summed_per_rule_in_one_message():
    jobs = [
        ASKED,
        job(1, priority=1),
        job(2, priority=2),
        job(3, project="ml", estimated_runtime_s=60),
        job(4, project="ml", estimated_runtime_s=10 * 3600),  # behind: larger
    ]
    ranked = _rank("default", jobs, 9)
    assert ranked is not None
    assert ranked.ahead == (("priority", 2), ("shorter", 1))
    assert ranked.message == (
        "4 of 5 waiting; ahead of it: 2 by a higher priority; 1 by a smaller expected GPU-time"
        "; it is in LAS queue 0 (0: least GPU-time received)"
    )
    assert (ranked.expected_gpu_s, ranked.expected_from) == (7200.0, "its estimated runtime")
    assert ranked.waited_s == pytest.approx(HOUR - 9) and not ranked.starving


@pytest.mark.parametrize(
    ("kw", "history", "expected", "source"),
    [
        ({"max_runtime_s": 600, "gpus": 4}, {}, 2400.0, "its time limit"),
        ({}, {("user", "job9"): (100.0, 300.0, 200.0)}, 200.0,
         "the median runtime of user's earlier jobs named job9"),
        ({}, {}, 86400.0, "the cluster's default runtime"),
    ],
)  # fmt: skip
def test_where_the_expected_size_comes_from(kw, history, expected, source):
    asked = job(9, **kw)
    policy = settings(queue_policy="sjf")
    ranked = rank_of([asked], 9, settings=policy, history=history, now=T0)
    assert ranked is not None
    assert (ranked.expected_gpu_s, ranked.expected_from) == (expected, source)
    assert ranked.message == "1 of 1 waiting: first in line"


def test_a_job_not_in_the_order_has_no_rank():
    assert _rank("fifo", [job(1)], 9) is None


def _mixed_queue() -> list:
    """Jobs that every rule puts ahead of some other: priorities, starving ones, three
    projects, sizes from history, estimates and limits, service received."""
    jobs = []
    for i in range(1, 121):
        jobs.append(
            job(
                i,
                project=("ml", "cv", "ab")[i % 3],
                priority=(0, 0, 0, 5, -1)[i % 5],
                gpus=1 + i % 4,
                submitted_at=T0 - timedelta(hours=(i * 7) % 60),
                estimated_runtime_s=None if i % 4 == 0 else 600 * (i % 9 + 1),
                max_runtime_s=None if i % 8 else 7200,
                name=f"t{i % 6}",
                attained_gpu_s=float((i * 911) % 20_000),
            )
        )
    return jobs


@pytest.mark.parametrize(
    ("policy", "starvation_after_s"),
    [("default", 0.0), ("default", 30 * 3600.0), ("fifo", 0.0), ("priority", 0.0),
     ("fair-share", 0.0), ("sjf", 0.0), ("las", 0.0)],
)  # fmt: skip
def test_ranks_of_a_whole_queue_at_once_are_each_job_s_own_rank(policy, starvation_after_s):
    """What a full cycle stores for GET /jobs/{id}/rank (its keys, counted by ahead_of:
    rank_all) is what rank_of says of each job alone: the same counts by the same rules."""
    policy_settings = settings(
        queue_policy=policy,
        las_thresholds_gpu_s=(3600.0, 10_000.0),
        starvation_after_s=starvation_after_s,
    )
    history = {("user", "t1"): (300.0, 900.0), ("user", "t2"): (40_000.0,)}
    order = _ordered(policy_settings, history)
    everyone = rank_all(order, settings=policy_settings, history=history, now=T0)

    each = [rank_of(order, j.id, settings=policy_settings, history=history, now=T0) for j in order]
    assert everyone == each
    assert len({r.ahead for r in everyone}) > 10  # the rules at work, not all "earlier"
    if starvation_after_s:
        assert any(rule == "starving" for r in everyone for rule, _ in r.ahead)


def _ordered(policy_settings, history) -> list:
    return order_jobs(
        _mixed_queue(), settings=policy_settings, projects=PROJECTS, running=(),
        history=history, now=T0,
    )  # fmt: skip


@pytest.mark.parametrize("policy", ["default", "fair-share", "sjf", "las"])
def test_jobs_placed_since_the_ranking_are_not_counted_ahead(policy):
    """The API counts from the last full cycle's keys while later cycles place jobs: the
    jobs gone since count by no rule, as if the queue had been ranked without them."""
    policy_settings = settings(queue_policy=policy, las_thresholds_gpu_s=(3600.0, 10_000.0))
    history = {("user", "t1"): (300.0, 900.0)}
    order = _ordered(policy_settings, history)
    keys = rank_keys(order, settings=policy_settings, history=history, now=T0)
    gone = frozenset(range(0, 60, 7))
    rest = [j for i, j in enumerate(order) if i not in gone]
    for i in (60, 90, 119):
        alone = rank_of(rest, order[i].id, settings=policy_settings, history=history, now=T0)
        assert alone is not None
        assert ahead_of(keys, i, policy, gone=gone) == alone.ahead
        assert ahead_of(keys, i, policy) != alone.ahead  # the gone ones were ahead


@pytest.mark.parametrize("policy", ["default", "sjf", "las", "fifo"])
def test_kept_classes_give_the_ranks_of_a_ranking_from_scratch(policy):
    """A full cycle keeps the jobs' classes for the next one (RankClasses): whatever the
    next queue is (reordered, jobs gone and new, views replaced, a LAS queue changed by
    promotion, another runtime history), the keys are those ranked from scratch."""
    policy_settings = settings(
        queue_policy=policy, las_thresholds_gpu_s=(3600.0, 10_000.0), promote_after_service=2.0
    )
    kept = RankClasses()
    queue = _mixed_queue()
    history: dict = {("user", "t1"): (300.0, 900.0)}
    for step in range(6):
        now = T0 + timedelta(hours=10 * step)  # promotions move LAS queues as time passes
        order = order_jobs(queue, settings=policy_settings, projects=PROJECTS, running=(),
                           history=history, now=now)  # fmt: skip
        with_kept = rank_keys(order, settings=policy_settings, history=history, now=now, kept=kept)
        scratch = rank_keys(order, settings=policy_settings, history=history, now=now)
        assert with_kept == scratch
        # The next queue: the first few placed, one view replaced, one job new, another
        # runtime history (the job that ended).
        queue = queue[5:]
        queue[3] = replace(queue[3], estimated_runtime_s=123)
        queue.append(job(1000 + step, project="cv", gpus=2, name="t1"))
        history = {**history, ("user", "t1"): (*history[("user", "t1")], 60.0 * (step + 1))}
    assert len(kept.example) > 0  # it kept classes throughout
