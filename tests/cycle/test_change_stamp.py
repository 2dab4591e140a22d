"""The change-stamp a full cycle reads its queue by (issue 42 point 4): every UPDATE of a
job moves its row_version, whoever writes (a trigger); a full cycle reads whole rows only
of the waiting jobs whose stamp moved since it read them, and follows its own reason
writes without reading them back."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, text, update

from app.cycle.apply import write_reasons
from app.cycle.run import run_cycle
from app.cycle.snapshot import QueueMemory
from app.db import utcnow
from app.jobs.allocations import release
from app.jobs.models import Job
from app.messaging import NullMessenger
from tests.cycle.jobs_api import SETTINGS, add_node, finish, grant_priority, positions, submit


def _full(api, memory: QueueMemory):
    report = run_cycle(
        factory=api.factory, messenger=NullMessenger(), settings=SETTINGS, holder="t",
        now=utcnow(), memory=memory, full_every_s=5.0,
    )  # fmt: skip
    assert report.ran
    return report


def _stamps(api) -> dict[int, int]:
    with api.factory() as session:
        return dict(session.execute(select(Job.id, Job.row_version)).all())


def _positions(api) -> dict[int, int | None]:
    return positions(api)


def test_every_update_moves_the_stamp_whoever_writes(api):
    jobs = [submit(api, name=f"j{i}")["id"] for i in range(4)]
    before = _stamps(api)
    with api.factory() as session:
        job = session.get(Job, jobs[0])
        job.priority = 2  # through the ORM
        session.execute(update(Job).where(Job.id == jobs[1]).values(gpus=2))  # a statement
        session.execute(text("UPDATE job SET name = 'raw' WHERE id = :id"), {"id": jobs[2]})
        session.commit()
    after = _stamps(api)
    assert after[jobs[0]] == before[jobs[0]] + 1
    assert after[jobs[1]] == before[jobs[1]] + 1
    assert after[jobs[2]] == before[jobs[2]] + 1
    assert after[jobs[3]] == before[jobs[3]]  # not written: as it was


def test_the_cycles_reason_writes_move_the_stamp_by_exactly_one(api):
    jobs = [submit(api, name=f"j{i}")["id"] for i in range(2)]
    before = _stamps(api)
    with api.factory() as session:
        write_reasons(session, changes=[(jobs[0], "resources", "waiting", 1, None)])
        write_reasons(session, changes=[(jobs[1], 2)], columns=("queue_position",))
        session.commit()
    after = _stamps(api)
    assert after[jobs[0]] == before[jobs[0]] + 1 and after[jobs[1]] == before[jobs[1]] + 1


def test_a_full_cycle_rereads_only_the_jobs_changed_since_the_last(api):
    add_node(api, 1)
    running = submit(api, name="running")["id"]
    waiting = [submit(api, name=f"w{i}")["id"] for i in range(4)]
    memory = QueueMemory()
    _full(api, memory)  # the first: every job read (it places "running")
    assert memory.views.reread == len(waiting) + 1
    # Its own writes (every reason and position) are followed, not read back.
    _full(api, memory)
    assert memory.views.reread == 0
    views = memory.views.views
    grant_priority(api)
    r = api.client.patch(
        f"/api/v1/jobs/{waiting[2]}", json={"priority": 3}, headers=api.as_("alice")
    )
    assert r.status_code == 200, r.text
    with api.factory() as session:  # a write the app's code does not make: seen as well
        session.execute(
            text("UPDATE job SET estimated_runtime_s = 60 WHERE id = :id"), {"id": waiting[3]}
        )
        session.commit()
    _full(api, memory)
    assert memory.views.reread == 2
    again = memory.views.views
    assert again[waiting[0]] is views[waiting[0]] and again[waiting[1]] is views[waiting[1]]
    assert again[waiting[2]].priority == 3 and again[waiting[3]].estimated_runtime_s == 60
    assert _positions(api)[waiting[2]] == 1  # ranked by its new priority
    # The running job ends: the head starts, every position behind it moves (written by
    # the cycle, followed), and the next cycle reads none of them back.
    finish(api, running)
    _full(api, memory)
    placed = waiting[2]
    assert placed not in _positions(api)
    _full(api, memory)
    assert memory.views.reread == 0
    assert set(memory.views.views) == set(waiting) - {placed}


def test_a_reason_written_by_another_writer_is_read_again(api):
    """The cache keeps each job's reason as read or as the cycle wrote it; another writer's
    reason (a second scheduler, a settle step) moves the stamp and is read back."""
    add_node(api, 1)
    submit(api, name="running")
    waiting = [submit(api, name=f"w{i}")["id"] for i in range(2)]
    memory = QueueMemory()
    _full(api, memory)
    _full(api, memory)
    before = _reasons(api)
    with api.factory() as session:  # another writer's message
        session.execute(
            update(Job).where(Job.id == waiting[0]).values(pending_message="said elsewhere")
        )
        session.commit()
    _full(api, memory)
    assert memory.views.reread == 1
    assert _reasons(api) == before  # its message written again: the cycle saw the other


def _reasons(api) -> dict[int, tuple[str | None, int | None]]:
    with api.factory() as session:
        return {
            job_id: (message, key)
            for job_id, message, key in session.execute(
                select(Job.id, Job.pending_message, Job.queue_position).where(
                    Job.status == "PENDING"
                )
            )
        }


def test_a_job_back_in_the_queue_is_read_in_id_order(api):
    """A full read keeps its jobs in id order without sorting 20,000 ids each cycle: jobs
    new to it go after the others, so one that comes back to the queue (requeued, with a
    lower id than the jobs waiting) must be put in its place."""
    add_node(api, 1)
    first = submit(api, name="first")["id"]
    waiting = [submit(api, name=f"w{i}")["id"] for i in range(3)]
    memory = QueueMemory()
    _full(api, memory)
    _full(api, memory)
    assert list(memory.views.rows) == waiting  # `first` runs
    with api.factory() as session:  # back in the queue, as a requeue leaves it
        release(session, job_id=first)
        session.execute(
            update(Job).where(Job.id == first).values(status="PENDING", pending_reason="NEW")
        )
        session.commit()
    _full(api, memory)

    assert list(memory.views.rows) == [first, *waiting]


def test_a_whole_read_in_parts_by_schedule_mode_is_kept_in_id_order(api, monkeypatch):
    """A read of many stale jobs takes the whole queue at once, one part per schedule
    mode: the jobs come back grouped by mode, and are kept in id order all the same."""
    import app.cycle.snapshot as snapshot

    monkeypatch.setattr(snapshot, "STALE_BY_ID", 0)
    add_node(api, 1)
    first = submit(api, name="first")["id"]  # read with them, then placed
    began = (utcnow() - timedelta(minutes=1)).isoformat()
    at = {"schedule": {"mode": "at", "at": began}}
    ids = [submit(api, name=f"m{i}", **(at if i % 2 else {}))["id"] for i in range(6)]
    memory = QueueMemory()
    _full(api, memory)
    assert list(memory.views.rows) == [first, *ids]
