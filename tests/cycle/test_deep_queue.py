"""A deep queue cannot keep a runnable job from idle GPUs (issues 42 and 34).

Jobs that cannot run yet (begin time ahead, off-peak window closed) are left out by the
database and get their reasons without the planner; past the read's limit, each
project's head is read in turn. Bob's deep queues are written in bulk (21,000 jobs: over
the full read's 20,000), alice's job comes through the API, as users' would.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import event, func, select, update

from app.cycle.run import run_cycle
from app.cycle.snapshot import QueueMemory, read_snapshot
from app.db import utcnow
from app.jobs.models import Job
from app.jobs.states import JobStatus
from app.messaging import NullMessenger
from tests.cycle.jobs_api import SETTINGS, get_job, run_one_cycle, submit
from tests.foundation.builders import insert_jobs, ready_node

DEEP = 21_000  # over the full read's limit (read_snapshot's max_pending)
DEEP_MIXED = 100_000  # issue 42 point 1


def _cycle(api, memory: QueueMemory, *, full: bool, now=None):
    return run_cycle(factory=api.factory, messenger=NullMessenger(), settings=SETTINGS,
                     holder="t", now=now or utcnow(), all_positions=full, memory=memory)  # fmt: skip


def _node(api, gpus: int = 8, now=None) -> None:
    with api.factory.begin() as session:
        session.add(ready_node("n1", gpus=gpus, now=now or utcnow()))


def _status(api, job_id: int) -> JobStatus:
    with api.factory() as session:
        return session.scalars(select(Job.status).where(Job.id == job_id)).one()


def _reasons(api, ids: list[int]) -> dict[tuple, int]:
    """How many of the jobs show each (reason, message, position, estimated start)."""
    with api.factory() as session:
        rows = session.execute(
            select(Job.pending_reason, Job.pending_message, Job.queue_position,
                   Job.estimated_start_at, func.count())
            .where(Job.id.between(ids[0], ids[-1]))
            .group_by(Job.pending_reason, Job.pending_message, Job.queue_position,
                      Job.estimated_start_at)
        ).all()  # fmt: skip
    return {tuple(row[:4]): row[4] for row in rows}


def _nightly_window(api) -> datetime:
    """An off-peak window "nightly" of an hour, opening in about two hours: when."""
    opens = (utcnow() + timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
    r = api.client.post(
        "/api/v1/windows",
        json={"name": "nightly", "timezone": "UTC", "cron": f"0 {opens.hour} * * *",
              "duration_s": 3600},
        headers=api.as_("admin"),
    )  # fmt: skip
    assert r.status_code == 201, r.text
    return opens


def test_a_deep_queue_of_begin_time_jobs_does_not_keep_a_runnable_job_from_idle_gpus(api):
    begins = (utcnow() + timedelta(days=1)).replace(microsecond=0)
    tomorrow = insert_jobs(api.factory, user="bob", project="cv", count=DEEP,
                           schedule_mode="at", begin_at=begins)  # fmt: skip
    _node(api)  # after the slow part: its telemetry is fresh for the cycle
    job = submit(api, user="alice", gpus=1)

    run_one_cycle(api)

    assert _status(api, job["id"]) is JobStatus.SCHEDULED
    # Bob's jobs say why they wait, as the core's begin-time filter says it, each of them;
    # not ranked, they have no place in the queue.
    message = "begin time not reached"
    assert _reasons(api, tomorrow) == {("begin_time", message, None, begins): DEEP}
    shown = get_job(api, tomorrow[-1])
    assert (shown["pending_reason"], shown["pending_message"]) == ("begin_time", message)
    # The time is data, for each client to format: the reason's end, the begin time.
    assert datetime.fromisoformat(shown["pending_until"]) == begins


def test_a_runnable_job_behind_100_000_that_cannot_run_yet_starts_in_one_quick_cycle(api):
    """Each way a job cannot run yet, 20,000 of each: begin time ahead, held, waiting on a
    dependency, off-peak window closed, and array tasks over their array's limit. Phase 0
    judges them by statements, a group of alike jobs at a time: a quick cycle loads none
    of them whole (it loaded every dependent job and every throttled task, each cycle:
    0.6-0.7 s for 25,000 of either)."""
    _nightly_window(api)
    preprocess = submit(api, user="bob", gpus=8)["id"]  # what the dependent jobs wait for
    each = DEEP_MIXED // 5
    insert_jobs(api.factory, user="bob", project="cv", count=each,
                schedule_mode="at", begin_at=utcnow() + timedelta(days=1))  # fmt: skip
    insert_jobs(api.factory, user="bob", project="cv", count=each, held_by="bob")
    insert_jobs(api.factory, user="bob", project="cv", count=each,
                dependencies_met=False, depends_on=[preprocess])  # fmt: skip
    insert_jobs(api.factory, user="bob", project="cv", count=each,
                schedule_mode="offpeak", window="nightly")  # fmt: skip
    tasks = insert_jobs(api.factory, user="bob", project="cv", count=each, array_max_running=2)
    with api.factory.begin() as session:
        session.execute(
            update(Job)
            .where(Job.id >= tasks[0])
            .values(array_id=tasks[0], array_index=Job.id - tasks[0])
        )
    memory = QueueMemory()
    assert _cycle(api, memory, full=True).placed == 0  # no node yet
    assert memory.ready
    _node(api)  # after the slow part: its telemetry is fresh for the quick cycle
    job = submit(api, user="alice", gpus=1)
    loaded: list[int] = []

    def count(target: Job, _context) -> None:
        loaded.append(target.id)

    event.listen(Job, "load", count)
    try:
        quick = _cycle(api, memory, full=False)
    finally:
        event.remove(Job, "load", count)

    assert _status(api, job["id"]) is JobStatus.SCHEDULED
    # Alice's job and the two tasks the array lets in are placed; the preprocessing job
    # (8 GPUs) waits beside them. Nothing else was loaded whole.
    assert quick.placed == 3
    assert len(loaded) <= 10, len(loaded)
    # Each says why it waits (a held job's reason is its hold, shown by the API).
    with api.factory() as session:
        kinds = dict(
            session.execute(
                select(Job.pending_reason, func.count())
                .where(Job.status == JobStatus.PENDING, Job.held_by.is_(None))
                .group_by(Job.pending_reason)
            ).all()
        )
    assert kinds == {
        "begin_time": each, "dependency": each, "window_closed": each,
        "array_limit": each - 2, "waiting_for_gpus": 1,
    }  # fmt: skip


def _begins_in(api, delay: timedelta):
    """A node and a job that begins `delay` from now, after a full cycle: (the job, the
    queue memory, that cycle's report, now)."""
    start = utcnow()
    _node(api, now=start)
    memory = QueueMemory()
    job = submit(api, user="bob", gpus=1,
                 schedule={"mode": "at", "at": (start + delay).isoformat()})  # fmt: skip
    return job, memory, _cycle(api, memory, full=True, now=start), start


def test_a_job_whose_begin_time_comes_is_read_by_the_next_quick_cycle(api):
    soon, memory, waiting, start = _begins_in(api, timedelta(seconds=3))
    assert get_job(api, soon["id"])["pending_reason"] == "begin_time"
    assert waiting.wake_at == start + timedelta(seconds=3)  # the scheduler cycles then

    assert _cycle(api, memory, full=False, now=start + timedelta(seconds=4)).placed == 1
    assert _status(api, soon["id"]) is JobStatus.SCHEDULED


def test_a_cycle_puts_no_job_back_in_line_while_no_begin_time_has_come(api):
    # Each cycle used to run the UPDATE for jobs whose begin time had come, due or not.
    later, memory, _, start = _begins_in(api, timedelta(hours=1))
    engine = api.factory.kw["bind"]
    updates: list[str] = []

    def seen(_conn, _cursor, statement, parameters, *_):
        if "begin time reached" in str(parameters):
            updates.append(statement)

    event.listen(engine, "before_cursor_execute", seen)
    try:
        quick = _cycle(api, memory, full=False, now=start + timedelta(seconds=5))
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert updates == []
    assert quick.wake_at == start + timedelta(hours=1)
    assert get_job(api, later["id"])["pending_reason"] == "begin_time"


def test_over_the_read_limit_every_project_s_head_is_read_and_placed(api):
    # Runnable but waiting: a GPU model no node has (bob could also simply be first).
    deep = insert_jobs(api.factory, user="bob", project="cv", count=DEEP, gpu_model="A100-40GB")
    _node(api)  # after the slow part: its telemetry is fresh for the cycle
    job = submit(api, user="alice", gpus=1)

    run_one_cycle(api)

    assert _status(api, job["id"]) is JobStatus.SCHEDULED
    assert get_job(api, deep[0])["pending_reason"] == "gpu_model_unavailable"


def test_a_read_over_its_limit_takes_each_project_s_head_in_turn(api):
    bob = insert_jobs(api.factory, user="bob", project="cv", count=30)
    urgent = insert_jobs(api.factory, user="bob", project="cv", count=1, priority=5)
    alice = insert_jobs(api.factory, user="alice", project="ml", count=3)

    with api.factory() as session:
        ctx = read_snapshot(session=session, now=utcnow(), half_life_s=3600, max_pending=8)

    read = [j.id for j in ctx.snapshot.pending]
    # Alice's three, and bob's five first by priority, then by submission; in id order.
    assert read == sorted([*alice, *urgent, *bob[:4]])


def test_jobs_outside_their_off_peak_window_are_not_read_and_say_when_it_opens(api):
    opens = _nightly_window(api)
    night = insert_jobs(api.factory, user="bob", project="cv", count=DEEP,
                        schedule_mode="offpeak", window="nightly")  # fmt: skip
    now = utcnow()  # after the slow part: the node's telemetry is fresh for the cycle
    _node(api, now=now)
    job = submit(api, user="alice", gpus=1)

    report = _cycle(api, QueueMemory(), full=True, now=now)

    assert _status(api, job["id"]) is JobStatus.SCHEDULED
    message = "off-peak window closed"
    assert _reasons(api, night) == {("window_closed", message, None, opens): DEEP}
    shown = get_job(api, night[-1])
    assert datetime.fromisoformat(shown["pending_until"]) == opens  # the next opening
    assert report.wake_at == opens


def test_a_job_waiting_for_its_begin_time_is_not_ranked_and_its_rank_says_when_it_starts(api):
    _node(api, gpus=1)
    submit(api, user="alice", gpus=1)  # runs
    waiting = submit(api, user="alice", gpus=1)
    later = submit(api, user="alice", gpus=1,
                   schedule={"mode": "at", "at": (utcnow() + timedelta(hours=1)).isoformat()})  # fmt: skip
    run_one_cycle(api)

    # Ranked among the jobs that may run: the one waiting for GPUs is first, alone.
    assert get_job(api, waiting["id"])["queue_position"] == 1
    assert get_job(api, later["id"])["queue_position"] is None
    r = api.client.get(f"/api/v1/jobs/{later['id']}/rank", headers=api.as_("alice"))
    detail = r.json()["detail"]
    assert r.status_code == 409 and "not in the queue yet: begin time not reached" in detail
