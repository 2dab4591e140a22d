"""Quick cycles (between full ones) read only the head of the queue and new arrivals."""

from __future__ import annotations

from prometheus_client import REGISTRY
from sqlalchemy import select, update

from app.cycle.run import run_cycle
from app.cycle.settings import SchedulerSettings
from app.cycle.snapshot import QueueMemory, read_snapshot
from app.db import utcnow
from app.jobs.models import Job
from app.messaging import NullMessenger
from app.projects.models import Project
from app.scheduling.types import ReasonKind
from tests.cycle.jobs_api import finish
from tests.foundation.builders import ready_node

SETTINGS = SchedulerSettings(stability_window_s=0, preemption=False)


def _submit(api, user="alice", **body):
    body.setdefault("command", ["train"])
    r = api.client.post("/api/v1/jobs", json=body, headers=api.as_(user))
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _node(factory, gpus: int) -> None:
    with factory() as session:
        session.add(ready_node("n1", gpus=gpus, now=utcnow()))
        session.commit()


def _cycle(api, memory: QueueMemory, *, full: bool):
    return run_cycle(factory=api.factory, messenger=NullMessenger(), settings=SETTINGS, holder="t",
                     now=utcnow(), all_positions=full, memory=memory)  # fmt: skip


def _plans(kind: str) -> float:
    """Plan phases observed so far by the scheduler's metrics, of this kind."""
    return REGISTRY.get_sample_value("gpusched_scheduling_plan_seconds_count", {"kind": kind}) or 0


def _reason(api, job_id: int) -> str | None:
    with api.factory() as session:
        return session.scalar(select(Job.pending_reason).where(Job.id == job_id))


def test_a_quick_read_sees_the_remembered_head_and_new_jobs_only(api):
    head, ranked_behind, new = _submit(api), _submit(api), _submit(api)
    with api.factory() as session:
        # A full cycle ranked the first two; the second one fell behind the head.
        session.execute(update(Job).where(Job.id.in_([head, ranked_behind])).values(
            pending_reason="RESOURCES", queue_position=1))  # fmt: skip
        session.commit()
        project_id = session.scalar(select(Project.id).where(Project.name == "ml"))
        memory = QueueMemory(order=[head], usage={project_id: 1234.0}, ready=True)
        ctx = read_snapshot(session=session, now=utcnow(), half_life_s=3600, quick_from=memory)
    assert ctx.quick
    assert [j.id for j in ctx.snapshot.pending] == [head, new]
    usage = {p.name: p.usage_gpu_s for p in ctx.snapshot.projects}
    assert usage["ml"] == 1234.0  # from the last full read, not recomputed


def test_quick_cycles_read_the_head_and_place_new_jobs(api):
    _node(api.factory, gpus=1)
    memory = QueueMemory()
    queued = [_submit(api) for _ in range(80)]
    plans = {kind: _plans(kind) for kind in ("full", "quick")}

    first = _cycle(api, memory, full=False)  # nothing remembered yet: a full read
    assert (first.placed, first.pending, memory.ready) == (1, 79, True)
    assert ReasonKind.NEW.value not in {_reason(api, j) for j in queued[1:]}
    depth = 64 + 4 * 1  # per GPU

    # Between full cycles: only the head (the placed job, gone now, and 67 waiting ones)
    # and the new arrival.
    arrival = _submit(api)
    quick = _cycle(api, memory, full=False)
    assert (quick.placed, quick.pending) == (0, depth - 1 + 1)
    assert _reason(api, arrival) not in (None, ReasonKind.NEW.value)  # ranked near the head
    assert queued[0] not in memory.order  # no longer pending: forgotten

    # A full cycle reads everything again.
    full = _cycle(api, memory, full=True)
    assert (full.placed, full.pending) == (0, 80)
    # Operators see the two kinds apart (the first cycle read everything: a full one).
    assert (_plans("full") - plans["full"], _plans("quick") - plans["quick"]) == (2, 1)


def test_the_head_a_quick_cycle_reads_slides_forward_as_jobs_start(api):
    """Jobs that started leave the remembered order, so the next quick cycle reads jobs
    further back (without a full cycle, the head would run dry)."""
    _node(api.factory, gpus=1)
    memory = QueueMemory()
    queued = [_submit(api) for _ in range(100)]

    assert _cycle(api, memory, full=True).placed == 1
    with api.factory() as session:
        # The first 80 jobs in the queue leave it (cancelled, say).
        session.execute(update(Job).where(Job.id.in_(queued[:80])).values(status="CANCELLED"))
        session.commit()
    quick = _cycle(api, memory, full=False)
    assert quick.pending == 0  # the 68 it asked for were all gone
    assert memory.order == queued[68:]
    again = _cycle(api, memory, full=False)
    assert again.pending == 20  # the next ones in the remembered order
    assert memory.order == queued[80:]


def test_a_quick_cycle_reads_an_arrival_once_then_finds_it_in_the_remembered_order(api):
    """New jobs ranked behind the head keep their NEW reason until a full cycle ranks
    them; the quick cycles after the one that read them do not read them all again."""
    _node(api.factory, gpus=16)
    memory = QueueMemory()
    for _ in range(200):
        _submit(api)
    assert _cycle(api, memory, full=True).placed == 16
    depth = 64 + 4 * 16
    arrivals = [_submit(api) for _ in range(30)]

    first = _cycle(api, memory, full=False)
    # The head (the 16 placed ones are gone) and every arrival.
    assert first.pending == depth - 16 + 30
    # Ranked 113th to 142nd, past the 100 positions a quick cycle rewrites: still NEW.
    assert {_reason(api, a) for a in arrivals} == {ReasonKind.NEW.value}

    second = _cycle(api, memory, full=False)
    # Only the head: the arrivals that fell behind it wait there, as older jobs do.
    assert second.pending == depth
    assert set(arrivals) <= set(memory.order)
    assert {a for a in arrivals if a not in memory.head(depth)} <= memory.arrivals_read

    _cycle(api, memory, full=True)  # ranks them all: nothing left to leave out
    assert memory.arrivals_read == set()


def test_an_arrival_that_started_and_came_back_is_read_again(api):
    _node(api.factory, gpus=1)
    memory = QueueMemory()
    blocker = _submit(api)
    assert _cycle(api, memory, full=True).placed == 1
    arrival = _submit(api)
    assert _cycle(api, memory, full=False).pending == 1  # read: GPU busy
    assert arrival in memory.arrivals_read

    finish(api, blocker)
    assert _cycle(api, memory, full=False).placed == 1  # the arrival starts
    _cycle(api, memory, full=False)  # asks for it, finds it gone: forgotten
    finish(api, arrival, "PREEMPTED")  # back in the queue, NEW again
    assert _reason(api, arrival) == ReasonKind.NEW.value
    assert _cycle(api, memory, full=False).placed == 1
