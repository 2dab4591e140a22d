"""Running a batch by hand (`kubectl create job --from=cronjob/NAME`): now, as its owner,
under its concurrency policy, without moving its schedule."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import delete, select

from app.auth.service import Principal
from app.batches import service
from app.batches.schemas import FiringOut
from app.db import utcnow
from app.errors import Conflict
from app.jobs.models import Job, JobEvent
from app.jobs.orders import AfterCommit
from app.jobs.states import JobStatus
from app.projects.models import ProjectMember
from app.wire import StopJob
from tests.batches.conftest import World


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def run(world: World, principal: Principal, now: datetime) -> tuple[FiringOut, AfterCommit]:
    with world.factory() as session:
        changed = service.run_batch(
            session=session, principal=principal, name="nightly", limits=world.limits, now=now
        )
    return changed.value, changed.after


def events(world: World, job_id: int) -> list[tuple[str, str]]:
    with world.factory() as session:
        query = select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
        return [(e.actor, e.reason) for e in session.scalars(query)]


def test_a_run_by_hand_submits_now_and_the_schedule_still_fires_its_own_time(
    world: World, alice: Principal
) -> None:
    sid = world.create(alice, utc(2026, 1, 1), cron="0 2 * * *")
    # Half a second after the 02:00 fire time, before the scheduler's check has seen it.
    firing, after = run(world, alice, utc(2026, 1, 1, 2, 0, 0, 500_000))
    assert (firing.run_by, firing.skipped, firing.error, after.orders) == ("alice", False, None, ())
    (by_hand,) = firing.job_ids
    assert events(world, by_hand) == [("alice", "batch 'nightly' run by alice")]

    # The fire time is still due: a run by hand is not one of the schedule's times.
    assert world.fire(utc(2026, 1, 1, 2, 0, 1)).count("submitted") == 1
    assert world.fire(utc(2026, 1, 1, 2, 0, 6)).firings == []
    assert [(f.run_by, len(f.job_ids)) for f in world.firings(sid)] == [
        (None, 1),  # fire_at 02:00
        ("alice", 1),  # fire_at 02:00:00.5
    ]
    jobs = world.jobs()
    assert [(j.user_id, j.batch_id, j.labels) for j in jobs] == [
        (alice.user_id, sid, {"batch": "nightly"})
    ] * 2
    with world.factory() as session:
        out = service.get_batch(session=session, principal=alice, name="nightly", now=utcnow())
    assert out.last_fired_at == utc(2026, 1, 1, 2)  # the schedule's, not the run's


def test_an_admin_runs_a_disabled_batch_as_its_owner(world: World, alice: Principal) -> None:
    root = world.user("root", [], admin=True)
    world.create(alice, utc(2026, 1, 1), enabled=False)
    firing, _ = run(world, root, utc(2026, 1, 1, 12))
    assert firing.run_by == "root"
    (job,) = world.jobs()
    assert job.user_id == alice.user_id and job.id == firing.job_ids[0]
    assert events(world, job.id) == [("root", "batch 'nightly' run by root")]
    assert world.fire(utc(2026, 1, 2, 2, 0, 1)).firings == []  # still disabled


def test_forbid_refuses_a_run_while_an_earlier_firings_job_has_not_ended(
    world: World, alice: Principal
) -> None:
    sid = world.create(alice, utc(2026, 1, 1), concurrency="forbid")
    (first,) = world.fire(utc(2026, 1, 1, 2, 0, 1)).submitted_jobs
    with pytest.raises(Conflict) as refused:
        run(world, alice, utc(2026, 1, 1, 3))
    assert refused.value.message == (
        f"jobs {first} of an earlier firing have not ended (concurrency: forbid): "
        "cancel them or wait until they end"
    )
    assert len(world.firings(sid)) == 1 and len(world.jobs()) == 1
    with world.factory.begin() as session:
        session.get_one(Job, first).status = JobStatus.SUCCEEDED
    firing, _ = run(world, alice, utc(2026, 1, 1, 4))
    assert len(firing.job_ids) == 1 and len(world.jobs()) == 2


def test_replace_cancels_the_earlier_firings_jobs_and_returns_their_stops(
    world: World, alice: Principal
) -> None:
    running, waiting = world.replacing_batch_with_a_placed_job(alice)

    firing, after = run(world, alice, utc(2026, 1, 1, 9))
    assert after.orders == (StopJob(node="n1", job_id=running, attempt=1, reason="cancel"),)
    assert after.cycle  # for the jobs it submitted
    why = "replaced by a run of batch 'nightly' by alice"
    assert events(world, waiting)[-1] == ("batch:nightly", f"cancelled: {why}")
    statuses = {j.id: j.status for j in world.jobs()}
    assert statuses[waiting] is JobStatus.CANCELLED
    assert [statuses[j] for j in firing.job_ids] == [JobStatus.PENDING] * 2


def test_a_run_that_cannot_submit_is_a_conflict_that_records_nothing(
    world: World, alice: Principal
) -> None:
    sid = world.create(alice, utc(2026, 1, 1))
    with world.factory.begin() as session:
        session.execute(delete(ProjectMember).where(ProjectMember.user_id == alice.user_id))
    root = world.user("root", [], admin=True)
    with pytest.raises(Conflict) as refused:
        run(world, root, utc(2026, 1, 1, 12))
    assert refused.value.message.startswith("batch 'nightly' cannot submit its jobs now: ")
    assert "project" in refused.value.message
    assert world.firings(sid) == [] and world.jobs() == []
