"""Job dependencies (depends_on, sbatch --dependency=afterok): a job waits, out of the
queue, until the jobs it names have succeeded; if one ends otherwise it is cancelled."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from app.cycle.dependencies import settle_dependencies
from app.cycle.run import run_cycle
from app.cycle.settings import SchedulerSettings
from app.cycle.snapshot import read_snapshot
from app.db import utcnow
from app.jobs.dependencies import Dependency, Namesake, judge, singleton_verdict, singleton_wait
from app.jobs.models import Job
from app.jobs.states import JobStatus as S
from app.messaging import NullMessenger
from app.scheduling import plan_cycle
from tests.cycle.jobs_api import (
    SETTINGS,
    add_node,
    finish,
    get_job,
    job_events,
    run_one_cycle,
    submit,
)

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def _dep(job_id: int, status: S, finished_min: int | None = None) -> Dependency:
    finished = None if finished_min is None else T0 + timedelta(minutes=finished_min)
    return Dependency(job_id, f"j{job_id}", status, finished)


@pytest.mark.parametrize(
    ("depends_on", "jobs", "met", "broken", "met_at_min", "message"),
    [
        # Every dependency succeeded: eligible from the moment the last one did.
        ([1, 2], [_dep(1, S.SUCCEEDED, 5), _dep(2, S.SUCCEEDED, 9)], True, False, 9, ""),
        # The first unmet one is named, with its state, and how many more there are.
        (
            [1, 2, 3],
            [_dep(1, S.SUCCEEDED, 5), _dep(2, S.RUNNING), _dep(3, S.PENDING)],
            False,
            False,
            None,
            "waiting for job 2 (j2) and 1 more to succeed",
        ),
        # A failure with no retries left, a cancel or a timeout can never turn into success.
        (
            [1, 2],
            [_dep(1, S.RUNNING), _dep(2, S.FAILED, 3)],
            False,
            True,
            None,
            "job 2 (j2) it depends on ended FAILED",
        ),
        ([1], [_dep(1, S.CANCELLED, 1)], False, True, None, "job 1 (j1) it depends on ended CANCELLED"),
        ([1], [_dep(1, S.TIMED_OUT, 1)], False, True, None, "job 1 (j1) it depends on ended TIMED_OUT"),
        ([7], [], False, True, None, "job 7 it depends on no longer exists"),
        # Preempted or lost: it will run again, so the dependent keeps waiting.
        ([1], [_dep(1, S.PREEMPTED)], False, False, None, "waiting for job 1 (j1) to succeed"),
    ],
)  # fmt: skip
def test_judge(depends_on, jobs, met, broken, met_at_min, message):
    verdict = judge(depends_on, {j.id: j for j in jobs})  # afterok, the default
    met_at = None if met_at_min is None else T0 + timedelta(minutes=met_at_min)
    assert (verdict.met, verdict.broken, verdict.met_at, verdict.message) == (
        met,
        broken,
        met_at,
        message,
    )


@pytest.mark.parametrize(
    ("kind", "jobs", "met", "broken", "message"),
    [
        # afterany (a cleanup step): any end will do, a failure as well as a success.
        ("afterany", [_dep(1, S.FAILED, 3), _dep(2, S.SUCCEEDED, 5)], True, False, ""),
        ("afterany", [_dep(1, S.CANCELLED, 3), _dep(2, S.RUNNING)], False, False,
         "waiting for job 2 (j2) to end"),
        # afternotok (a fallback): only an end without success; a success means never.
        ("afternotok", [_dep(1, S.FAILED, 3), _dep(2, S.TIMED_OUT, 5)], True, False, ""),
        ("afternotok", [_dep(1, S.SUCCEEDED, 3)], False, True,
         "job 1 (j1) it depends on ended SUCCEEDED"),
        ("afternotok", [_dep(1, S.PENDING)], False, False, "waiting for job 1 (j1) to fail"),
        # A job that is gone breaks every kind: there is nothing left to wait for.
        ("afterany", [], False, True, "job 1 it depends on no longer exists"),
    ],
)  # fmt: skip
def test_judge_other_kinds(kind, jobs, met, broken, message):
    ids = [j.id for j in jobs] or [1]
    verdict = judge(ids, {j.id: j for j in jobs}, kind)
    assert (verdict.met, verdict.broken, verdict.message) == (met, broken, message)


def _placed(job_id: int, status: S, placed_min: int | None, finished_min: int | None = None):
    placed = None if placed_min is None else T0 + timedelta(minutes=placed_min)
    return replace(_dep(job_id, status, finished_min), placed_at=placed)


@pytest.mark.parametrize(
    ("jobs", "met", "met_at_min", "message"),
    [
        # Placed or running: started, so met from when the last one got its GPUs.
        ([_placed(1, S.SCHEDULED, 4), _placed(2, S.RUNNING, 2)], True, 4, ""),
        # Ended after running, however: it did start (placed_at stays set once it ends).
        ([_placed(1, S.FAILED, 3, 8)], True, 3, ""),
        # Cancelled before it ever started: nothing left to wait for (Slurm's after:ID).
        ([_placed(1, S.CANCELLED, None, 6)], True, 6, ""),
        # Waiting, or back in the queue after a preemption: not started (again) yet.
        ([_placed(1, S.RUNNING, 1), _placed(2, S.PENDING, None)], False, None,
         "waiting for job 2 (j2) to start"),
        ([_placed(1, S.PREEMPTED, None)], False, None, "waiting for job 1 (j1) to start"),
    ],
)  # fmt: skip
def test_judge_after_waits_only_for_the_start(jobs, met, met_at_min, message):
    verdict = judge([j.id for j in jobs], {j.id: j for j in jobs}, "after")
    met_at = None if met_at_min is None else T0 + timedelta(minutes=met_at_min)
    assert (verdict.met, verdict.broken, verdict.met_at, verdict.message) == (
        met,
        False,  # an `after` job never breaks
        met_at,
        message,
    )


def test_a_monitor_starts_in_the_cycle_after_its_run_was_placed(api):
    add_node(api, 8)
    train = submit(api, name="train", gpus=2)["id"]
    monitor = submit(api, name="monitor", depends_on=[train], dependency="after")
    assert (monitor["pending_reason"], monitor["pending_message"]) == (
        "dependency",
        f"waiting for job {train} (train) to start",
    )
    now = utcnow()
    first = run_cycle(
        factory=api.factory, messenger=NullMessenger(), settings=SETTINGS, holder="t", now=now
    )
    assert get_job(api, train)["status"] == "SCHEDULED"
    assert get_job(api, monitor["id"])["status"] == "PENDING"
    # It placed a job that a job waits `after`: the next cycle is asked for at once.
    assert first.wake_at == now
    run_one_cycle(api)
    assert get_job(api, monitor["id"])["status"] == "SCHEDULED"
    # Submitted once its run has started, it is queued at once; no cycle to wait for.
    late = submit(api, name="monitor2", depends_on=[train], dependency="after")
    assert late["pending_reason"] == "NEW"
    # Cancelled before it started, the run lets its monitor in all the same.
    blocked = submit(api, name="big", gpus=8)["id"]  # waits: 4 of the 8 GPUs are in use
    watcher = submit(api, name="watcher", depends_on=[blocked], dependency="after")["id"]
    cancelled = api.client.post(f"/api/v1/jobs/{blocked}/cancel", headers=api.as_("alice"))
    assert cancelled.status_code == 200, cancelled.text
    run_one_cycle(api)
    assert get_job(api, watcher)["status"] == "SCHEDULED"
    # An ordinary cycle that places no awaited job asks for no extra cycle.
    calm = run_cycle(
        factory=api.factory, messenger=NullMessenger(), settings=SETTINGS, holder="t", now=now
    )
    assert calm.wake_at is None


def test_a_job_starts_only_once_its_dependency_has_succeeded(api):
    add_node(api, 2)
    train = submit(api, name="train")["id"]
    evaluate = submit(api, name="eval", depends_on=[train, train])
    assert evaluate["depends_on"] == [train]  # the same job named twice is one dependency
    assert (evaluate["pending_reason"], evaluate["pending_message"]) == (
        "dependency",
        f"waiting for job {train} (train) to succeed",
    )

    run_one_cycle(api)
    # A GPU is free, but eval is not in the queue: it waits, with no position.
    assert get_job(api, train)["status"] == "SCHEDULED"
    waiting = get_job(api, evaluate["id"])
    assert (waiting["status"], waiting["pending_reason"], waiting["queue_position"]) == (
        "PENDING",
        "dependency",
        None,
    )

    finish(api, train, "SUCCEEDED")
    run_one_cycle(api)  # one cycle: it joins the queue and is placed
    assert get_job(api, evaluate["id"])["status"] == "SCHEDULED"


def test_a_failed_dependency_cancels_the_chain_behind_it(api):
    add_node(api, 1)
    train = submit(api, name="train", retries=1)["id"]
    evaluate = submit(api, name="eval", depends_on=[train])["id"]
    report = submit(api, name="report", depends_on=[evaluate])["id"]
    run_one_cycle(api)
    finish(api, train, "FAILED")  # a retry is left: back in the queue
    run_one_cycle(api)
    assert [get_job(api, j)["status"] for j in (train, evaluate, report)] == [
        "SCHEDULED",
        "PENDING",
        "PENDING",
    ]

    finish(api, train, "FAILED")  # no retry left: eval can never start, nor report
    run_one_cycle(api)
    assert [get_job(api, j)["status"] for j in (train, evaluate, report)] == [
        "FAILED",
        "CANCELLED",
        "CANCELLED",
    ]
    events = job_events(api, report)
    assert (events[-1]["actor"], events[-1]["reason"]) == (
        "scheduler",
        f"dependency never satisfied: job {evaluate} (eval) it depends on ended CANCELLED",
    )


def test_a_cleanup_runs_after_a_failure_and_a_fallback_only_after_one(api):
    add_node(api, 2)
    train = submit(api, name="train")["id"]
    cleanup = submit(api, name="cleanup", depends_on=[train], dependency="afterany")
    fallback = submit(api, name="fallback", depends_on=[train], dependency="afternotok")
    assert (cleanup["dependency"], cleanup["pending_message"]) == (
        "afterany",
        f"waiting for job {train} (train) to end",
    )
    run_one_cycle(api)
    finish(api, train, "SUCCEEDED")
    run_one_cycle(api)
    # A success: cleanup runs; the fallback, for a failure only, never will.
    assert get_job(api, cleanup["id"])["status"] == "SCHEDULED"
    assert get_job(api, fallback["id"])["status"] == "CANCELLED"
    assert job_events(api, fallback["id"])[-1]["reason"] == (
        f"dependency never satisfied: job {train} (train) it depends on ended SUCCEEDED"
    )

    failing = submit(api, name="train2")["id"]
    rescue = submit(api, name="rescue", depends_on=[failing], dependency="afternotok")["id"]
    run_one_cycle(api)
    finish(api, failing, "FAILED")
    run_one_cycle(api)
    assert get_job(api, rescue)["status"] == "SCHEDULED"

    # Known at submit: a fallback for a job that already succeeded could never start.
    r = api.client.post(
        "/api/v1/jobs",
        json={"command": ["x"], "depends_on": [train], "dependency": "afternotok"},
        headers=api.as_("alice"),
    )
    assert r.status_code == 422
    assert r.json()["errors"][0]["msg"] == (
        f"job {train} (train) it depends on ended SUCCEEDED, so this job could never start"
    )
    r = api.client.post(
        "/api/v1/jobs",
        json={"command": ["x"], "depends_on": [train], "dependency": "before"},
        headers=api.as_("alice"),
    )
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "dependency"]


def test_submit_checks_the_dependencies(api):
    mine = submit(api)["id"]
    theirs = submit(api, user="bob")["id"]  # bob's project, which alice is not in

    def refused(depends_on) -> tuple[list, str]:
        r = api.client.post(
            "/api/v1/jobs",
            json={"command": ["eval"], "depends_on": depends_on},
            headers=api.as_("alice"),
        )
        assert r.status_code == 422, r.text
        [error] = r.json()["errors"]
        return error["loc"], error["msg"]

    # A job alice cannot see is answered as one that does not exist.
    assert refused([mine, 999_999]) == (["body", "depends_on"], "no job 999999 in your projects")
    assert refused([theirs]) == (["body", "depends_on"], f"no job {theirs} in your projects")
    assert refused([0])[0] == ["body", "depends_on", 0]
    assert refused(list(range(1, 66)))[0] == ["body", "depends_on"]  # at most 64

    assert api.client.post(f"/api/v1/jobs/{mine}/cancel", headers=api.as_("alice")).is_success
    assert refused([mine]) == (
        ["body", "depends_on"],
        f"job {mine} (train) it depends on ended CANCELLED, so this job could never start",
    )

    # An admin may name any job; one that already succeeded is met at once.
    with api.factory.begin() as session:
        done = session.get_one(Job, theirs)
        done.status, done.finished_at = S.SUCCEEDED, utcnow()
    ready = submit(api, user="admin", project="ml", depends_on=[theirs])
    assert (ready["pending_reason"], ready["depends_on"]) == ("NEW", [theirs])

    # A batch fires new jobs each time: a fixed job id makes no sense in its templates.
    r = api.client.post(
        "/api/v1/batches",
        json={"name": "nightly", "cron": "0 2 * * *", "templates": [{"command": ["x"], "depends_on": [theirs]}]},
        headers=api.as_("alice"),
    )  # fmt: skip
    assert r.status_code == 422 and r.json()["errors"][0]["loc"][-3:] == [
        "templates",
        0,
        "depends_on",
    ]


def test_time_waiting_on_dependencies_does_not_count_as_waiting(api):
    """Else a job submitted two days ago behind a long training run would, once eligible,
    go ahead of everything submitted meanwhile (FIFO) or first as starving (default)."""
    add_node(api, 1)
    train = submit(api, name="train")["id"]
    run_one_cycle(api)
    dependent = submit(api, name="dependent", depends_on=[train])["id"]
    later = submit(api, name="later")["id"]
    finish(api, train, "SUCCEEDED")
    now = utcnow()
    with api.factory.begin() as session:
        session.get_one(Job, dependent).created_at = now - timedelta(days=2)
        session.get_one(Job, later).created_at = now - timedelta(hours=2)
        session.get_one(Job, train).finished_at = now - timedelta(hours=1)
    with api.factory.begin() as session:
        settle_dependencies(session, now=now)
    with api.factory() as session:
        job = session.get_one(Job, dependent)
        assert job.dependencies_met and job.ineligible_s == 47 * 3600  # until train succeeded

    for policy in ("fifo", "default"):
        settings = SchedulerSettings(stability_window_s=0, policy=policy)
        with api.factory() as session:
            ctx = read_snapshot(session=session, now=now, half_life_s=3600)
        plan = plan_cycle(ctx.snapshot, now=now, settings=settings.policy_settings())
        assert plan.queue_order == (later, dependent), policy  # "later" has waited longer


def test_a_hold_while_waiting_on_dependencies_is_not_counted_twice(api):
    train = submit(api, name="train")["id"]
    dependent = submit(api, depends_on=[train], hold=True)["id"]
    now = utcnow()
    with api.factory.begin() as session:
        job = session.get_one(Job, dependent)
        job.created_at = job.held_at = now - timedelta(hours=3)
        done = session.get_one(Job, train)
        done.status, done.finished_at = S.SUCCEEDED, now - timedelta(hours=2)
    with api.factory.begin() as session:
        settle_dependencies(session, now=now)
    released = api.client.post(f"/api/v1/jobs/{dependent}/release", headers=api.as_("alice"))
    assert released.status_code == 200, released.text
    with api.factory() as session:
        # Three hours not eligible, from submission to release: not 1 + 3 + 2.
        assert abs(session.get_one(Job, dependent).ineligible_s - 3 * 3600) <= 5


def test_released_or_changed_it_still_says_it_waits_for_its_dependency(api):
    train = submit(api, name="train")["id"]
    dependent = submit(api, depends_on=[train], hold=True)["id"]
    for action in ("release", "change"):
        if action == "release":
            r = api.client.post(f"/api/v1/jobs/{dependent}/release", headers=api.as_("alice"))
        else:
            r = api.client.patch(
                f"/api/v1/jobs/{dependent}", json={"priority": -3}, headers=api.as_("alice")
            )
        assert r.status_code == 200, r.text
        assert (r.json()["pending_reason"], r.json()["pending_message"]) == (
            "dependency",
            f"waiting for job {train} (train) to succeed",
        ), action


@pytest.mark.parametrize(
    ("job_id", "namesakes", "waits_for"),
    [
        # None left of its name: it may be queued.
        (5, [], None),
        # An earlier singleton of its name has not ended (waiting or placed): it waits.
        (5, [Namesake(3, S.PENDING, True), Namesake(5, S.PENDING, True)], 3),
        (5, [Namesake(3, S.PREEMPTED, True)], 3),
        # A later singleton waits for it, not the other way round.
        (5, [Namesake(5, S.PENDING, True), Namesake(8, S.PENDING, True)], None),
        # Any job of its name that is placed, singleton or not, earlier or later.
        (5, [Namesake(8, S.RUNNING, False)], 8),
        (5, [Namesake(2, S.SCHEDULED, False)], 2),
        # An earlier job of its name that is not a singleton and not placed does not count.
        (5, [Namesake(2, S.PENDING, False)], None),
        # Being submitted (no id yet): every singleton of its name is earlier.
        (None, [Namesake(9, S.PENDING, True)], 9),
    ],
)  # fmt: skip
def test_singleton_wait(job_id, namesakes, waits_for):
    message = singleton_wait(job_id, "nightly", namesakes)
    expected = (
        None
        if waits_for is None
        else f"waiting for job {waits_for} (nightly) to end: one job named 'nightly' at a time"
    )
    assert message == expected
    if job_id is not None:  # the cycle's verdict on a queued singleton: never broken
        verdict = singleton_verdict(job_id, "nightly", namesakes)
        assert (verdict.met, verdict.broken, verdict.message) == (
            expected is None,
            False,
            expected or "",
        )


def test_singleton_jobs_of_a_name_run_one_at_a_time_in_submit_order(api):
    add_node(api, 4)
    first = submit(api, name="nightly", dependency="singleton")
    assert first["pending_reason"] == "NEW"  # none of its name: queued at once
    second = submit(api, name="nightly", dependency="singleton")
    third = submit(api, name="nightly", dependency="singleton")
    one_at_a_time = "(nightly) to end: one job named 'nightly' at a time"
    assert (second["pending_reason"], second["pending_message"]) == (
        "dependency",
        f"waiting for job {first['id']} {one_at_a_time}",
    )
    bobs = submit(api, user="bob", name="nightly", dependency="singleton")["id"]  # his own
    other = submit(api, name="eval")["id"]

    run_one_cycle(api)
    status = {j: get_job(api, j)["status"] for j in (first["id"], second["id"], bobs, other)}
    assert list(status.values()) == ["SCHEDULED", "PENDING", "SCHEDULED", "SCHEDULED"]
    assert get_job(api, third["id"])["pending_message"] == (
        f"waiting for job {first['id']} {one_at_a_time}"  # the first of those it waits for
    )
    # A plain job of the name is not held back, but once placed it holds them back too.
    plain = submit(api, name="nightly")["id"]
    run_one_cycle(api)
    assert get_job(api, plain)["status"] == "SCHEDULED"
    finish(api, first["id"], "FAILED")  # however it ended
    run_one_cycle(api)
    waiting = get_job(api, second["id"])
    assert (waiting["status"], waiting["pending_message"]) == (
        "PENDING",
        f"waiting for job {plain} {one_at_a_time}",
    )

    finish(api, plain, "SUCCEEDED")
    run_one_cycle(api)
    assert get_job(api, second["id"])["status"] == "SCHEDULED"
    assert get_job(api, third["id"])["status"] == "PENDING"


def test_a_singleton_names_no_jobs_and_is_no_array(api):
    job = submit(api)["id"]
    for body, loc, msg in (
        (
            {"depends_on": [job]},
            ["body", "depends_on"],
            "a singleton job names no jobs: it waits for your other jobs of the same name",
        ),
        (
            {"array": {"indices": "0-3"}},
            ["body", "dependency"],
            "singleton does not apply to an array: give it max_running 1 to run its tasks "
            "one at a time",
        ),
    ):
        r = api.client.post(
            "/api/v1/jobs",
            json={"command": ["x"], "dependency": "singleton", **body},
            headers=api.as_("alice"),
        )
        assert r.status_code == 422, r.text
        assert (r.json()["errors"][0]["loc"], r.json()["errors"][0]["msg"]) == (loc, msg)
