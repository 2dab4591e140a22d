"""Firing with an injected clock (no sleeping): when, how often, and what gets submitted."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import delete, select

from app.auth.service import Principal
from app.batches import service
from app.batches.schemas import BatchIn
from app.jobs.limits import RuntimeLimits
from app.jobs.models import Job, JobEvent
from app.jobs.states import JobStatus
from app.projects.models import Project, ProjectMember
from app.windows.models import Window
from app.wire import StopJob
from tests.batches.conftest import World

NY = ZoneInfo("America/New_York")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def run_clock(world: World, start: datetime, end: datetime, step: timedelta) -> None:
    at = start
    while at <= end:
        world.fire(at)
        at += step


def test_daily_batch_fires_at_local_time_across_fall_back_once_per_day(
    world: World, alice: Principal
) -> None:
    sid = world.create(alice, utc(2026, 10, 30, 12), cron="30 1 * * *", timezone="America/New_York")
    run_clock(world, utc(2026, 10, 30, 12), utc(2026, 11, 2, 12), timedelta(minutes=5))
    firings = world.firings(sid)
    assert [f.fire_at.astimezone(NY).isoformat() for f in firings] == [
        "2026-10-31T01:30:00-04:00",
        "2026-11-01T01:30:00-04:00",
        "2026-11-02T01:30:00-05:00",
    ]
    assert all(len(f.job_ids) == 1 and not f.skipped for f in firings)
    assert len(world.jobs()) == 3


def test_daily_batch_fires_once_on_spring_forward_day(world: World, alice: Principal) -> None:
    sid = world.create(alice, utc(2026, 3, 6, 12), cron="30 2 * * *", timezone="America/New_York")
    run_clock(world, utc(2026, 3, 6, 12), utc(2026, 3, 9, 12), timedelta(minutes=5))
    assert [f.fire_at.astimezone(NY).isoformat() for f in world.firings(sid)] == [
        "2026-03-07T02:30:00-05:00",
        "2026-03-08T03:00:00-04:00",
        "2026-03-09T02:30:00-04:00",
    ]
    assert len(world.jobs()) == 3


def test_fires_within_seconds_of_the_fire_time_and_only_once(
    world: World, alice: Principal
) -> None:
    world.create(alice, utc(2026, 1, 1))
    assert world.fire(utc(2026, 1, 1, 1, 59, 59)).firings == []
    report = world.fire(utc(2026, 1, 1, 2, 0, 3))
    assert [f.outcome for f in report.firings] == ["submitted"]
    for seconds in (4, 8, 13, 600):
        assert world.fire(utc(2026, 1, 1, 2, 0) + timedelta(seconds=seconds)).firings == []
    assert len(world.jobs()) == 1


def test_jobs_are_submitted_as_the_owner_with_batch_label_and_event(
    world: World, alice: Principal
) -> None:
    world.create(alice, utc(2026, 1, 1))
    world.fire(utc(2026, 1, 1, 2, 0, 1))
    (job,) = world.jobs()
    assert job.user_id == alice.user_id
    assert job.labels == {"batch": "nightly"}
    assert job.schedule_mode == "now"
    with world.factory() as session:
        project = session.scalar(select(Project.name).where(Project.id == job.project_id))
        event = session.scalar(select(JobEvent).where(JobEvent.job_id == job.id))
    assert project == "ml"
    assert event is not None and event.actor == "batch:nightly"


def test_never_fires_for_times_before_creation(world: World, alice: Principal) -> None:
    world.create(alice, utc(2026, 1, 1, 2, 0, 30))  # 30 s after a fire time
    assert world.fire(utc(2026, 1, 1, 2, 0, 35)).firings == []
    assert world.fire(utc(2026, 1, 2, 2, 0, 1)).count("submitted") == 1


def test_disabled_never_fires_and_re_enabling_does_not_catch_up(
    world: World, alice: Principal
) -> None:
    sid = world.create(alice, utc(2026, 1, 1), enabled=False)
    run_clock(world, utc(2026, 1, 1), utc(2026, 1, 3, 12), timedelta(minutes=30))
    assert world.firings(sid) == []
    with world.factory() as session:
        out = service.set_enabled(
            session=session, principal=alice, name="nightly", enabled=True, now=utc(2026, 1, 3, 12)
        )
    assert out.next_fire_at is not None and out.next_fire_at.isoformat().startswith("2026-01-04")
    assert world.fire(utc(2026, 1, 3, 12, 0, 5)).firings == []  # no catch-up of 2026-01-03
    assert world.fire(utc(2026, 1, 4, 2, 0, 5)).count("submitted") == 1
    with world.factory() as session:
        service.set_enabled(
            session=session, principal=alice, name="nightly", enabled=False, now=utc(2026, 1, 4, 3)
        )
    assert world.fire(utc(2026, 1, 5, 2, 0, 5)).firings == []
    assert len(world.firings(sid)) == 1


def test_changed_cron_takes_effect_on_the_next_check(world: World, alice: Principal) -> None:
    sid = world.create(alice, utc(2026, 1, 1))
    with world.factory() as session:
        body = BatchIn.model_validate(
            {
                "name": "nightly",
                "cron": "15 10 * * *",
                "templates": [{"command": ["python", "train.py"]}],
            }
        )
        service.replace_batch(
            session=session,
            principal=alice,
            name="nightly",
            body=body,
            limits=world.limits,
            now=utc(2026, 1, 1, 10, 7),
        )
    assert world.fire(utc(2026, 1, 1, 10, 15, 4)).count("submitted") == 1
    assert world.fire(utc(2026, 1, 2, 2, 0, 4)).firings == []  # the old 02:00 is gone
    assert [f.fire_at for f in world.firings(sid)] == [utc(2026, 1, 1, 10, 15)]


def test_catch_up_once_after_three_days_of_downtime_submits_one_batch(
    world: World, alice: Principal
) -> None:
    sid = world.create(alice, utc(2026, 1, 1))
    assert world.fire(utc(2026, 1, 1, 2, 0, 2)).count("submitted") == 1
    # Beat down from 2026-01-01 02:01 until 2026-01-04 10:00: three fire times missed.
    report = world.fire(utc(2026, 1, 4, 10))
    assert [(f.outcome, f.fire_at) for f in report.firings] == [("submitted", utc(2026, 1, 4, 2))]
    assert world.fire(utc(2026, 1, 4, 10, 0, 5)).firings == []
    assert [f.fire_at for f in world.firings(sid)] == [utc(2026, 1, 1, 2), utc(2026, 1, 4, 2)]
    assert len(world.jobs()) == 2


def test_skip_records_a_late_fire_time_as_skipped_and_runs_nothing(
    world: World, alice: Principal
) -> None:
    sid = world.create(alice, utc(2026, 1, 1), catch_up="skip")
    report = world.fire(utc(2026, 1, 4, 10))
    assert [(f.outcome, f.fire_at) for f in report.firings] == [("skipped", utc(2026, 1, 4, 2))]
    assert world.fire(utc(2026, 1, 4, 10, 0, 5)).firings == []
    (firing,) = world.firings(sid)
    assert firing.skipped and firing.job_ids == []
    assert world.jobs() == []
    # Within the tolerance (60 s with a 5 s check interval) it still runs.
    assert world.fire(utc(2026, 1, 5, 2, 0, 59)).count("submitted") == 1
    assert world.fire(utc(2026, 1, 6, 2, 1, 1)).count("skipped") == 1


def test_two_templates_make_two_jobs_in_one_firing(world: World, alice: Principal) -> None:
    sid = world.create(
        alice,
        utc(2026, 1, 1),
        templates=[
            {"name": "prep", "command": ["python", "prep.py"], "gpus": 0},
            {"name": "train", "command": "python train.py", "gpus": 2, "labels": {"x": "1"}},
        ],
    )
    world.fire(utc(2026, 1, 1, 2, 0, 1))
    (firing,) = world.firings(sid)
    jobs = world.jobs()
    assert sorted(firing.job_ids) == [j.id for j in jobs]
    assert [(j.name, j.gpus) for j in jobs] == [("prep", 0), ("train", 2)]
    assert jobs[1].labels == {"batch": "nightly", "x": "1"}


def test_offpeak_target_submits_offpeak_jobs(world: World, alice: Principal) -> None:
    with world.factory() as session:
        session.add(Window(name="night", timezone="UTC", cron="0 22 * * *", duration_s=8 * 3600))
        session.commit()
    world.create(alice, utc(2026, 1, 1), target="offpeak", window="night")
    world.create(alice, utc(2026, 1, 1), name="any-window", target="offpeak")
    world.fire(utc(2026, 1, 1, 2, 0, 1))
    jobs = world.jobs()
    assert [(j.schedule_mode, j.window) for j in jobs] == [("offpeak", "night"), ("offpeak", None)]


def test_a_cycle_is_wanted_after_the_commit_and_only_when_jobs_were_submitted(
    world: World, alice: Principal
) -> None:
    world.create(alice, utc(2026, 1, 1))
    world.create(alice, utc(2026, 1, 1), name="skipper", catch_up="skip", cron="0 1 * * *")
    assert not world.fire(utc(2026, 1, 1, 1, 30)).after  # only a skip
    report = world.fire(utc(2026, 1, 1, 2, 0, 1))
    assert report.after.cycle
    # Committed before the caller sends it: a new connection sees the job.
    assert len(world.jobs()) == 1


def test_a_firing_that_cannot_submit_is_recorded_once_with_the_reason(
    world: World, alice: Principal
) -> None:
    sid = world.create(alice, utc(2026, 1, 1))
    with world.factory() as session:
        session.execute(delete(ProjectMember).where(ProjectMember.user_id == alice.user_id))
        session.commit()
    report = world.fire(utc(2026, 1, 1, 2, 0, 1))
    assert [f.outcome for f in report.firings] == ["failed"]
    assert world.fire(utc(2026, 1, 1, 2, 0, 6)).firings == []
    (firing,) = world.firings(sid)
    assert firing.job_ids == [] and firing.error is not None and "project" in firing.error
    with world.factory() as session:
        assert session.scalar(select(Job.id)) is None


def test_a_batch_whose_window_was_deleted_fails_its_firing_saying_so(
    world: World, alice: Principal
) -> None:
    with world.factory() as session:
        session.add(Window(name="night", timezone="UTC", cron="0 22 * * *", duration_s=8 * 3600))
        session.commit()
    sid = world.create(alice, utc(2026, 1, 1), target="offpeak", window="night")
    with world.factory() as session:
        session.execute(delete(Window))
        session.commit()
    # Not jobs that would wait forever for a window nobody defines any more.
    assert [f.outcome for f in world.fire(utc(2026, 1, 1, 2, 0, 1)).firings] == ["failed"]
    (firing,) = world.firings(sid)
    assert firing.error == "schedule.window: no off-peak window named 'night'; defined: none"
    assert world.jobs() == []


def test_one_broken_schedule_does_not_stop_the_others(
    world: World, alice: Principal, monkeypatch
) -> None:
    first = world.create(alice, utc(2026, 1, 1), name="a")
    world.create(alice, utc(2026, 1, 1), name="b")
    real = service.fire_schedule

    def flaky(**kwargs):
        if kwargs["schedule_id"] == first:
            raise RuntimeError("boom")
        return real(**kwargs)

    monkeypatch.setattr(service, "fire_schedule", flaky)
    report = world.fire(utc(2026, 1, 1, 2, 0, 1))
    assert [f.schedule for f in report.firings] == ["b"]


def test_jobs_get_the_cluster_default_time_limit_when_the_batch_fires(
    world: World, alice: Principal
) -> None:
    templates = [{"command": ["train"]}, {"command": ["eval"], "max_runtime_s": 600}]
    world.create(alice, utc(2026, 1, 1), templates=templates)
    # Set after the batch was made: a template follows the cluster's setting.
    world.limits = RuntimeLimits(default_s=7200)
    assert world.fire(utc(2026, 1, 1, 2, 0, 4)).count("submitted") == 1
    assert [job.max_runtime_s for job in world.jobs()] == [7200, 600]


def test_each_firing_chains_its_own_jobs_as_the_templates_say(
    world: World, alice: Principal
) -> None:
    """A nightly prepare -> train -> eval pipeline: each night's eval waits for that
    night's train, not for another night's."""
    templates = [
        {"command": ["prep"], "name": "prep"},
        {"command": ["train"], "name": "train", "after": [0]},
        {"command": ["eval"], "name": "eval", "after": [1, 0]},
    ]
    world.create(alice, utc(2026, 1, 1), templates=templates)
    world.fire(utc(2026, 1, 1, 2, 0, 4))
    world.fire(utc(2026, 1, 2, 2, 0, 4))
    jobs = world.jobs()
    assert [(j.name, j.depends_on, j.dependencies_met) for j in jobs] == [
        ("prep", [], True),
        ("train", [jobs[0].id], False),
        ("eval", [jobs[1].id, jobs[0].id], False),
        ("prep", [], True),
        ("train", [jobs[3].id], False),
        ("eval", [jobs[4].id, jobs[3].id], False),
    ]
    assert jobs[2].pending_message == f"waiting for job {jobs[1].id} (train) and 1 more to succeed"


def test_a_template_may_be_an_array_and_a_later_one_waits_for_all_its_tasks(
    world: World, alice: Principal
) -> None:
    """A nightly sweep of 3 seeds, then one report once every seed has succeeded."""
    templates = [
        {"command": ["train"], "name": "seed", "array": {"indices": "0-2", "max_running": 2}},
        {"command": ["report"], "name": "report", "after": [0]},
    ]
    world.create(alice, utc(2026, 1, 1), templates=templates)
    world.fire(utc(2026, 1, 1, 2, 0, 4))
    jobs = world.jobs()
    seeds = [j.id for j in jobs if j.name == "seed"]
    assert [(j.name, j.array_index, j.array_max_running) for j in jobs] == [
        ("seed", 0, 2),
        ("seed", 1, 2),
        ("seed", 2, 2),
        ("report", None, None),
    ]
    assert jobs[3].depends_on == seeds


def test_a_cleanup_template_waits_for_the_firing_to_end_however_it_ends(
    world: World, alice: Principal
) -> None:
    templates = [
        {"command": ["train"], "name": "train"},
        {"command": ["cleanup"], "name": "cleanup", "after": [0], "dependency": "afterany"},
    ]
    world.create(alice, utc(2026, 1, 1), templates=templates)
    world.fire(utc(2026, 1, 1, 2, 0, 4))
    train, cleanup = world.jobs()
    assert (cleanup.depends_on, cleanup.dependency_kind) == ([train.id], "afterany")
    assert cleanup.pending_message == f"waiting for job {train.id} (train) to end"


def _finish(world: World, job_ids: list[int]) -> None:
    with world.factory.begin() as session:
        for job_id in job_ids:
            session.get_one(Job, job_id).status = JobStatus.SUCCEEDED


def test_jobs_carry_their_batch_every_task_of_an_array_too(world: World, alice: Principal) -> None:
    sid = world.create(
        alice,
        utc(2026, 1, 1),
        templates=[{"command": ["sweep"], "array": {"indices": "0-2"}}, {"command": ["report"]}],
    )
    world.fire(utc(2026, 1, 1, 2, 0, 1))
    assert [j.batch_id for j in world.jobs()] == [sid] * 4


def test_forbid_skips_a_fire_time_while_an_earlier_firings_job_has_not_ended(
    world: World, alice: Principal
) -> None:
    sid = world.create(alice, utc(2026, 1, 1), cron="0 * * * *", concurrency="forbid")
    first = world.fire(utc(2026, 1, 1, 1, 0, 1)).submitted_jobs
    assert len(first) == 1

    report = world.fire(utc(2026, 1, 1, 2, 0, 1))
    overlap = f"jobs {first[0]} of an earlier firing have not ended (concurrency: forbid)"
    assert [(f.outcome, f.error) for f in report.firings] == [("skipped", overlap)]
    firing = world.firings(sid)[-1]
    assert (firing.skipped, firing.job_ids, firing.error) == (True, [], overlap)
    assert len(world.jobs()) == 1

    _finish(world, first)
    assert world.fire(utc(2026, 1, 1, 3, 0, 1)).count("submitted") == 1
    # An allowing batch beside it overlaps its own jobs, as before.
    world.create(alice, utc(2026, 1, 1), name="overlapping", cron="30 * * * *")
    world.fire(utc(2026, 1, 1, 3, 30, 1))
    assert world.fire(utc(2026, 1, 1, 4, 30, 1)).count("submitted") == 1


def test_replace_cancels_an_earlier_firings_jobs_then_submits(
    world: World, alice: Principal
) -> None:
    running, waiting = world.replacing_batch_with_a_placed_job(alice)
    assert [j.status for j in world.jobs()] == [JobStatus.SCHEDULED, JobStatus.PENDING]

    report = world.fire(utc(2026, 1, 2, 2, 0, 1))
    assert len(report.submitted_jobs) == 2
    jobs = {j.id: j for j in world.jobs()}
    why = "replaced by the firing for 2026-01-02T02:00:00+00:00"
    # The placed one is asked to stop (its agent reports it CANCELLED); the waiting one ends.
    assert jobs[running].cancel_requested_at is not None
    assert jobs[waiting].status is JobStatus.CANCELLED
    assert report.after.of_type(StopJob) == [
        StopJob(node="n1", job_id=running, attempt=1, reason="cancel")
    ]
    with world.factory() as session:
        reasons = {
            e.job_id: (e.actor, e.reason)
            for e in session.scalars(select(JobEvent).order_by(JobEvent.id))
        }
    assert reasons[running] == ("batch:nightly", f"cancel requested ({why}); stopping the process")
    assert reasons[waiting] == ("batch:nightly", f"cancelled: {why}")
    assert [jobs[j].status for j in report.submitted_jobs] == [JobStatus.PENDING] * 2
