"""What a full cycle does not do again when little changed (issue 42 point 4; costs in
bench/deep_queue.py): views of unchanged waiting jobs are reused, ranks still right are
not computed again, and reasons and positions go to the database in one statement."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update

from app.cycle import ranks
from app.cycle import run as cycle_run
from app.cycle.apply import write_reasons
from app.cycle.eligibility import unsettled
from app.cycle.run import run_cycle
from app.cycle.snapshot import QueueMemory
from app.db import utcnow
from app.jobs.models import Job
from app.jobs.states import JobStatus
from app.messaging import NullMessenger
from tests.cycle.jobs_api import SETTINGS, add_node, finish, grant_priority, positions, submit
from tests.foundation.builders import insert_jobs


def _full(api, memory: QueueMemory, at=None):
    report = run_cycle(
        factory=api.factory, messenger=NullMessenger(), settings=SETTINGS, holder="t",
        now=at or utcnow(), memory=memory, full_every_s=5.0,
    )  # fmt: skip
    assert report.ran
    return report


def _positions(api) -> dict[int, int | None]:
    return positions(api)


def _rank(api, job: int) -> dict:
    r = api.client.get(f"/api/v1/jobs/{job}/rank", headers=api.as_("admin"))
    assert r.status_code == 200, r.text
    return r.json()


def test_unchanged_waiting_jobs_keep_their_views_and_a_changed_one_gets_a_new_one(api):
    add_node(api, 1)
    submit(api, name="running")
    waiting = [submit(api, name=f"w{i}")["id"] for i in range(3)]
    memory = QueueMemory()
    _full(api, memory)
    views = {view.id: view for view in memory.views.views.values()}
    assert set(waiting) <= set(views)
    grant_priority(api)
    r = api.client.patch(
        f"/api/v1/jobs/{waiting[1]}", json={"priority": 3}, headers=api.as_("alice")
    )
    assert r.status_code == 200, r.text
    _full(api, memory)
    again = {view.id: view for view in memory.views.views.values()}
    assert again[waiting[0]] is views[waiting[0]] and again[waiting[2]] is views[waiting[2]]
    assert again[waiting[1]] is not views[waiting[1]] and again[waiting[1]].priority == 3
    # It was ranked by its new priority: first in line.
    assert _positions(api)[waiting[1]] == 1


def test_ranks_still_right_are_not_computed_again_and_a_change_ranks_anew(api, monkeypatch):
    add_node(api, 1)
    running = submit(api, name="running", estimated_runtime_s=60)["id"]  # the shortest
    waiting = [submit(api, name=f"w{i}", estimated_runtime_s=600 * (3 - i))["id"] for i in range(3)]
    memory = QueueMemory()
    _full(api, memory)
    assert _positions(api).get(running) is None  # placed
    ranked = []
    real = ranks.rank_keys
    monkeypatch.setattr(ranks, "rank_keys", lambda *a, **k: ranked.append(1) or real(*a, **k))
    first = _rank(api, waiting[0])
    _full(api, memory)
    assert ranked == []  # nothing changed: the stored ranks are kept, with this cycle's time
    kept = _rank(api, waiting[0])
    assert kept["ranked_at"] > first["ranked_at"]
    assert {
        k: v for k, v in kept.items() if k not in ("ranked_at", "next_ranking_at", "waited_s")
    } == {k: v for k, v in first.items() if k not in ("ranked_at", "next_ranking_at", "waited_s")}
    finish(api, running)  # the GPU frees: the head of the queue starts, the rest move up
    _full(api, memory)
    assert ranked == [1]
    assert _rank(api, waiting[0])["position"] == first["position"] - 1


def test_a_job_starting_to_starve_ranks_the_queue_anew(api, monkeypatch):
    add_node(api, 1)
    submit(api, name="running")
    waiting = submit(api, name="waiting")["id"]
    settings = SETTINGS.model_copy(update={"starvation_after_s": 3600.0})
    memory = QueueMemory()
    now = utcnow()

    def full(at):
        return run_cycle(
            factory=api.factory, messenger=NullMessenger(), settings=settings, holder="t",
            now=at, memory=memory, full_every_s=5.0,
        )  # fmt: skip

    full(now)
    assert not _rank(api, waiting)["starving"]
    full(now + timedelta(seconds=10))
    assert not _rank(api, waiting)["starving"]
    full(now + timedelta(hours=2))  # it has waited past the limit since the last ranks
    assert _rank(api, waiting)["starving"]


@pytest.mark.parametrize("old_sqlite", [False, True])
def test_reasons_are_written_in_one_statement_as_the_orm_reads_them(api, monkeypatch, old_sqlite):
    jobs = [submit(api, name=f"j{i}")["id"] for i in range(3)]
    starts = utcnow().replace(microsecond=123456)
    with api.factory() as session:
        if old_sqlite:  # before UPDATE ... FROM: row by row
            if session.connection().dialect.name != "sqlite":
                pytest.skip("SQLite's fallback")
            monkeypatch.setattr(session.connection().dialect, "server_version_info", (3, 31, 1))
        write_reasons(
            session,
            changes=[
                (jobs[0], "resources", "waiting for 1 GPU", 2, starts),
                (jobs[2], "priority", 'behind 1 job; it\'s "quoted"', 1, None),
            ],
        )
        write_reasons(session, changes=[(jobs[1], 3)], columns=("queue_position",))
        session.commit()
    with api.factory() as session:
        rows = {
            job_id: rest
            for job_id, *rest in session.execute(
                select(
                    Job.id, Job.pending_reason, Job.pending_message, Job.queue_position,
                    Job.estimated_start_at,
                )
            )
        }  # fmt: skip
    assert rows[jobs[0]] == ["resources", "waiting for 1 GPU", 2, starts]
    assert rows[jobs[2]] == ["priority", 'behind 1 job; it\'s "quoted"', 1, None]
    assert rows[jobs[1]][2] == 3  # only its position: its reason as submitted
    assert rows[jobs[1]][0] == "NEW"


_STEPS = (
    "settle_dependencies",
    "settle_array_limits",
    "settle_never_in_window",
    "settle_clock_gates",
)


def test_phase_zero_runs_only_the_steps_that_have_jobs_to_settle(api, monkeypatch):
    """One read tells which kinds of waiting job phase 0 has to settle; a cycle with
    plain jobs only (a drain: every job's end triggers one) runs none of its steps."""
    ran: list[str] = []

    def spied(name):
        real = getattr(cycle_run, name)

        def step(*args, **kwargs):
            ran.append(name)
            return real(*args, **kwargs)

        return step

    for name in _STEPS:
        monkeypatch.setattr(cycle_run, name, spied(name))
    add_node(api, 1)
    submit(api, name="plain")

    def steps_run() -> set[str]:
        ran.clear()
        _full(api, QueueMemory())
        return set(ran)

    assert steps_run() == set()
    insert_jobs(api.factory, user="bob", project="cv", count=1,
                schedule_mode="at", begin_at=utcnow() + timedelta(days=1))  # fmt: skip
    assert steps_run() == {"settle_clock_gates"}
    insert_jobs(api.factory, user="bob", project="cv", count=1, array_max_running=2)
    assert steps_run() == {"settle_clock_gates", "settle_array_limits"}
    insert_jobs(api.factory, user="bob", project="cv", count=1, schedule_mode="offpeak")
    insert_jobs(api.factory, user="bob", project="cv", count=1, dependencies_met=False)
    assert steps_run() == set(_STEPS)


def test_unsettled_names_each_kind_of_waiting_job_once_one_waits(api):
    def kinds() -> tuple[bool, ...]:
        with api.factory() as session:
            found = unsettled(session)
        return (found.dependencies, found.arrays, found.offpeak, found.begin_times)

    assert kinds() == (False, False, False, False)
    insert_jobs(api.factory, user="bob", project="cv", count=1, dependencies_met=False)
    assert kinds() == (True, False, False, False)
    insert_jobs(api.factory, user="bob", project="cv", count=1, array_max_running=2)
    insert_jobs(api.factory, user="bob", project="cv", count=1, schedule_mode="offpeak")
    insert_jobs(api.factory, user="bob", project="cv", count=1,
                schedule_mode="at", begin_at=utcnow() + timedelta(days=1))  # fmt: skip
    assert kinds() == (True, True, True, True)
    with api.factory.begin() as session:  # only jobs still waiting count
        session.execute(update(Job).values(status=JobStatus.CANCELLED))
    assert kinds() == (False, False, False, False)
