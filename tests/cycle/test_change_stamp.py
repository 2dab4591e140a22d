"""The change-stamp a full cycle reads its queue by (issue 42 point 4): every UPDATE of a
job moves its row_version, whoever writes (a trigger); a full cycle reads whole rows only
of the waiting jobs whose stamp moved since it read them, and follows its own reason
writes without reading them back."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import delete, select, text, update

from app.cycle.apply import write_reasons
from app.cycle.eligibility import ClockGates
from app.cycle.run import run_cycle
from app.cycle.snapshot import QueueMemory, ViewCache, read_snapshot
from app.db import utcnow
from app.jobs.allocations import release
from app.jobs.models import Job
from app.messaging import NullMessenger
from app.nodes.models import Allocation, Gpu
from app.scheduling import WindowInterval
from tests.cycle.jobs_api import SETTINGS, add_node, finish, grant_priority, positions, submit


def _full(api, memory: QueueMemory, *, quick: bool = False):
    report = run_cycle(
        factory=api.factory, messenger=NullMessenger(), settings=SETTINGS, holder="t",
        now=utcnow(), memory=memory, full_every_s=5.0, all_positions=not quick,
    )  # fmt: skip
    assert report.ran
    return report


def _quick(api, memory: QueueMemory):
    return _full(api, memory, quick=True)


def _estimate_behind_the_apps_back(api, job_id: int, seconds: int) -> None:
    """A write the app's code does not make: raw SQL."""
    with api.factory() as session:
        session.execute(
            text("UPDATE job SET estimated_runtime_s = :s WHERE id = :id"),
            {"s": seconds, "id": job_id},
        )
        session.commit()


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
    _estimate_behind_the_apps_back(api, waiting[3], 60)  # seen as well
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


def test_a_quick_cycle_rereads_only_the_head_jobs_changed_since(api):
    # At 1,000 nodes the head a quick cycle takes is 2,000 jobs: read whole every time,
    # they made its snapshot slower than a full one's.
    add_node(api, 1)
    running = submit(api, name="running")["id"]
    waiting = [submit(api, name=f"w{i}")["id"] for i in range(4)]
    memory = QueueMemory()
    _full(api, memory)
    _full(api, memory)
    views = memory.views.views
    _quick(api, memory)
    # Only jobs changed since the last read are looked at, by their change-stamp: none.
    assert memory.views.stamps == 0 and memory.views.reread == 0
    _estimate_behind_the_apps_back(api, waiting[3], 60)
    _quick(api, memory)
    assert memory.views.stamps == 1 and memory.views.reread == 1
    again = memory.views.views
    assert again[waiting[0]] is views[waiting[0]] and again[waiting[3]].estimated_runtime_s == 60
    # The running job ends: the quick cycle places the head, now the shortest job.
    finish(api, running)
    _quick(api, memory)
    assert sorted(_positions(api)) == waiting[:3]


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


def _read(api, cache: ViewCache, now, windows=None) -> set[int]:
    """A full read of the waiting jobs the clock lets run at `now`, into `cache`."""
    with api.factory() as session:
        ctx = read_snapshot(
            session=session, now=now, half_life_s=3600,
            gates=ClockGates(now=now, windows=windows), views=cache,
        )  # fmt: skip
        session.rollback()
    return {job.id for job in ctx.snapshot.pending}


def test_a_full_read_looks_only_at_the_jobs_changed_since_the_last(api):
    """Not every waiting job's stamp, each cycle: the jobs written since the last read,
    found by where they changed (`Job.changed_in`)."""
    add_node(api, 1)
    waiting = [submit(api, name=f"w{i}")["id"] for i in range(30)]
    memory = QueueMemory()
    _full(api, memory)
    assert memory.views.stamps == len(waiting)  # the first read: every stamp
    _full(api, memory)  # reads back what the first one wrote (every reason)
    _full(api, memory)
    assert memory.views.stamps == 0
    with api.factory() as session:
        session.execute(update(Job).where(Job.id == waiting[7]).values(estimated_runtime_s=60))
        session.commit()
    _full(api, memory)
    assert memory.views.stamps == 1 and memory.views.reread == 1
    assert memory.views.views[waiting[7]].estimated_runtime_s == 60
    assert len(memory.views.rows) == len(waiting) - 1  # one of them placed
    _full(api, memory)  # reads back the reason it wrote for that one
    arrived = submit(api, name="arrived")["id"]  # a new row (SQLite: found by its id)
    _full(api, memory)
    assert memory.views.stamps == 1 and arrived in memory.views.rows


def test_a_write_that_commits_after_the_read_is_seen_by_the_next_one(api):
    """Transaction ids are handed out when a transaction first writes, not when it
    commits: a write begun before a read and committed after it carries an id lower than
    the writes the read saw. The next read still asks for it."""
    with api.factory() as session:
        if session.get_bind().dialect.name != "postgresql":
            pytest.skip("SQLite has one writer at a time: its counter follows commit order")
    waiting = [submit(api, name=f"w{i}")["id"] for i in range(3)]
    cache = ViewCache()
    now = utcnow()
    _read(api, cache, now)
    with api.factory() as slow:
        slow.execute(update(Job).where(Job.id == waiting[0]).values(priority=5))  # begun
        with api.factory() as quick:  # a later transaction, committed first
            quick.execute(update(Job).where(Job.id == waiting[1]).values(priority=6))
            quick.commit()
        _read(api, cache, now)
        assert cache.views[waiting[1]].priority == 6
        assert cache.views[waiting[0]].priority == 0  # not committed yet
        slow.commit()
    _read(api, cache, now)
    assert cache.stamps < len(waiting) and cache.views[waiting[0]].priority == 5


def test_a_begin_time_that_came_since_the_last_read_lets_its_job_in(api):
    """The clock lets a job in without a write of its row: the next read takes the jobs
    whose begin time came since the last one."""
    now = utcnow()
    early = submit(api, name="now")["id"]
    later = submit(
        api, name="at", schedule={"mode": "at", "at": (now + timedelta(seconds=30)).isoformat()}
    )["id"]
    cache = ViewCache()
    assert _read(api, cache, now) == {early}
    assert _read(api, cache, now + timedelta(seconds=10)) == {early}
    assert _read(api, cache, now + timedelta(seconds=40)) == {early, later}
    assert cache.stamps == 1  # a read of what changed, not of every stamp


def _day_and_nightly_jobs(api) -> tuple[int, int]:
    """A "nightly" window, a job that may run now and one that waits for the window."""
    r = api.client.post(
        "/api/v1/windows",
        json={"name": "nightly", "timezone": "UTC", "cron": "0 1 * * *", "duration_s": 3600},
        headers=api.as_("admin"),
    )
    assert r.status_code == 201, r.text
    day = submit(api, name="now")["id"]
    offpeak = submit(api, name="off", schedule={"mode": "offpeak", "window": "nightly"})["id"]
    return day, offpeak


def test_an_off_peak_window_that_opens_lets_its_jobs_in(api):
    now = utcnow()
    night = WindowInterval(
        name="nightly", opens_at=now + timedelta(seconds=30), closes_at=now + timedelta(hours=1)
    )
    day, offpeak = _day_and_nightly_jobs(api)
    cache = ViewCache()
    assert _read(api, cache, now, windows=(night,)) == {day}
    assert _read(api, cache, now + timedelta(seconds=10), windows=(night,)) == {day}
    assert _read(api, cache, now + timedelta(seconds=40), windows=(night,)) == {day, offpeak}


def test_a_window_that_closes_between_a_full_and_a_quick_read_leaves_its_jobs_out(api):
    """No row changes when a window closes: a quick read then looks at every head job's
    stamp (with the gates' condition), not only at the jobs written since."""
    now = utcnow()
    night = WindowInterval(
        name="nightly", opens_at=now - timedelta(hours=1), closes_at=now + timedelta(seconds=30)
    )
    day, offpeak = _day_and_nightly_jobs(api)
    memory = QueueMemory()

    def read(at, **quick):
        with api.factory() as session:
            ctx = read_snapshot(
                session=session, now=at, half_life_s=3600, views=memory.views,
                gates=ClockGates(now=at, windows=(night,)), **quick,
            )  # fmt: skip
            session.rollback()
        return ctx

    full = read(now)
    memory.remember(full, tuple(job.id for job in full.snapshot.pending))
    assert [job.id for job in read(now, quick_from=memory).snapshot.pending] == [day, offpeak]
    closed = read(now + timedelta(seconds=40), quick_from=memory)
    assert [job.id for job in closed.snapshot.pending] == [day]


def test_a_waiting_job_deleted_by_hand_leaves_the_queue_within_a_minute(api):
    """A deleted row leaves no change behind; every stamp is read once a minute."""
    waiting = [submit(api, name=f"w{i}")["id"] for i in range(3)]
    now = utcnow()
    cache = ViewCache()
    _read(api, cache, now)
    with api.factory() as session:
        session.execute(delete(Job).where(Job.id == waiting[0]))
        session.commit()
    _read(api, cache, now + timedelta(seconds=61))
    assert set(cache.rows) == set(waiting[1:]) and cache.stamps == 2


def test_a_clock_set_back_reads_every_stamp_again(api):
    """What the clock let in at the last read need not be let in at an earlier time."""
    now = utcnow()
    began = submit(
        api, name="at", schedule={"mode": "at", "at": (now - timedelta(minutes=5)).isoformat()}
    )["id"]
    cache = ViewCache()
    assert _read(api, cache, now) == {began}
    assert _read(api, cache, now - timedelta(minutes=10)) == set()


@pytest.mark.parametrize("later_s", [40, 2 * 86400], ids=["changed read", "every stamp read"])
def test_a_kept_view_drops_the_service_that_left_the_usage_horizon(api, later_s):
    """A waiting job whose earlier attempt's service leaves the usage horizon (a day at
    least) is not written to, so its row is not read again: its kept view is made anew
    with the service it has now (`_kept_views`), in either kind of full read."""
    add_node(api, 1)
    served = submit(api, name="served")["id"]
    fresh = submit(api, name="fresh")["id"]
    now = utcnow()
    with api.factory.begin() as session:
        gpu = session.scalars(select(Gpu)).first()
        assert gpu is not None
        # One GPU-hour, ended 30 s inside the horizon of a read at `now`.
        ended = now - timedelta(seconds=86400 - 30)
        session.add(
            Allocation(
                job_id=served,
                attempt=1,
                node_id=gpu.node_id,
                gpu_id=gpu.id,
                created_at=ended - timedelta(hours=1),
                released_at=ended,
            )
        )
    cache = ViewCache()

    def attained(at) -> dict[int, float]:
        with api.factory() as session:
            ctx = read_snapshot(session=session, now=at, half_life_s=3600.0, views=cache)
        return {view.id: view.attained_gpu_s for view in ctx.snapshot.pending}

    assert attained(now) == {served: pytest.approx(3600.0), fresh: 0.0}
    assert attained(now + timedelta(seconds=later_s)) == {served: 0.0, fresh: 0.0}
    assert cache.reread == 0  # neither row read again: their kept views were made anew
