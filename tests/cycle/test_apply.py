"""Phase 3 against a real database: re-verification, the fenced lease, and preemption
that hands GPUs over in the same transaction."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import event, select

from app.cycle import apply as apply_module
from app.cycle.apply import apply_plan
from app.cycle.reconcile import reconcile_node_attempts
from app.cycle.snapshot import read_snapshot
from app.db import utcnow
from app.jobs.agent_reports import job_finished
from app.jobs.allocations import release
from app.jobs.lifecycle import settle_interrupted, transition
from app.jobs.models import Job, JobEvent
from app.jobs.orders import released_gates
from app.jobs.states import JobStatus
from app.messaging import NullMessenger
from app.nodes.models import Allocation, Gpu
from app.scheduling import Placement, Plan, Preemption
from app.wire import AttemptRef, Finished, Heartbeat
from tests.cycle.jobs_api import lease_taken, positions
from tests.foundation.builders import add_node


def _submit(api, user="alice", **body):
    body.setdefault("command", ["train"])
    r = api.client.post("/api/v1/jobs", json=body, headers=api.as_(user))
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _apply(api, plan, *, holder="test"):
    now = utcnow()
    with api.factory() as session:
        token = lease_taken(session, holder=holder, now=now, ttl_s=30)
        ctx = read_snapshot(session=session, now=now, half_life_s=3600)
        session.rollback()
        return apply_plan(session, ctx=ctx, plan=plan, token=token, now=now)


def _placed_behind(api, urgent, victim, why):
    """`urgent` placed on n1's GPU 0 in place of `victim`, preempted `why`."""
    return _apply(
        api,
        Plan(
            placements=(Placement(urgent, (("n1", (0,)),), after_preemption_of=(victim,)),),
            preemptions=(Preemption(victim, urgent, why),),
        ),
    )


def _allocated(api):
    with api.factory() as session:
        return {
            g.index: g.allocated_milli for g in session.scalars(select(Gpu).order_by(Gpu.index))
        }


def test_placement_is_written_and_dispatched_once(api):
    add_node(api.factory, "n1", gpus=2)
    job_id = _submit(api, gpus=2)
    applied = _apply(api, Plan(placements=(Placement(job_id, (("n1", (0, 1)),)),)))
    assert applied.placed == [job_id]
    assert [d.gpu_indices for d in applied.dispatches] == [(0, 1)]
    assert _allocated(api) == {0: 1000, 1: 1000}
    # The same (now stale) plan again: the job is no longer pending, nothing changes.
    again = _apply(api, Plan(placements=(Placement(job_id, (("n1", (0, 1)),)),)))
    assert again.placed == [] and again.skipped == {job_id: "job changed since the snapshot"}
    assert _allocated(api) == {0: 1000, 1: 1000}


def test_a_gpu_taken_meanwhile_is_skipped_not_double_allocated(api):
    add_node(api.factory, "n1", gpus=1)
    first, second = _submit(api), _submit(api)
    plan = Plan(placements=(Placement(first, (("n1", (0,)),)), Placement(second, (("n1", (0,)),))))
    applied = _apply(api, plan)
    assert applied.placed == [first] and applied.skipped == {second: "GPU taken meanwhile"}
    with api.factory() as session:
        assert session.get(Job, second).status == JobStatus.PENDING
    assert _allocated(api) == {0: 1000}


def test_one_taken_gpu_skips_only_its_job_in_a_batch_of_placements(api):
    # Written in one savepoint first; the refused batch is retried one by one.
    add_node(api.factory, "n1", gpus=2)
    first, clash, third = _submit(api), _submit(api), _submit(api)
    plan = Plan(
        placements=(
            Placement(first, (("n1", (0,)),)),
            Placement(clash, (("n1", (0,)),)),
            Placement(third, (("n1", (1,)),)),
        )
    )
    applied = _apply(api, plan)
    assert applied.placed == [first, third] and applied.skipped == {clash: "GPU taken meanwhile"}
    assert [(d.job_id, d.attempt) for d in applied.dispatches] == [
        (first, 1),
        (third, 1),
    ]
    with api.factory() as session:
        rows = session.execute(select(Job.id, Job.status, Job.attempt).order_by(Job.id)).all()
    assert rows == [
        (first, JobStatus.SCHEDULED, 1),
        (clash, JobStatus.PENDING, 0),
        (third, JobStatus.SCHEDULED, 1),
    ]
    assert _allocated(api) == {0: 1000, 1: 1000}


def test_placements_are_written_in_statements_that_do_not_grow_with_their_number(api):
    # One read locks the jobs, one batch writes them (it was 9 statements per placement):
    # 2 or 6 placements, the same count. The jobs, their events and their allocations are
    # Core batches (the events went through the unit of work, on SQLite one by one).
    add_node(api.factory, "n1", gpus=8)
    engine = api.factory.kw["bind"]

    def statements(placed: int) -> int:
        jobs = [_submit(api) for _ in range(placed)]
        plan = Plan(placements=tuple(Placement(j, (("n1", (i,)),)) for i, j in enumerate(jobs)))
        seen = []
        listener = event.listens_for(engine, "before_cursor_execute")(lambda *_: seen.append(1))
        try:
            applied = _apply(api, plan)
        finally:
            event.remove(engine, "before_cursor_execute", listener)
        assert applied.placed == jobs
        # Frees the GPUs for the next plan.
        with api.factory() as session:
            for j in jobs:
                release(session, job_id=j)
            session.commit()
        return len(seen)

    statements(1)  # the first cycle also creates the lease row
    two, six = statements(2), statements(6)
    per_placement = (six - two) / 4
    assert per_placement == 0


def test_a_batch_is_written_by_one_statement_per_table_on_postgresql(api):
    # As executemanys, a cycle's 250 placements at 1,000 nodes were 250 UPDATEs of GPU
    # counters and 250 INSERTs the server ran one by one (25-35 ms each). Now the GPUs are
    # locked by one ordered read, and each table written by one set-based statement, with
    # the sums the rows would get one by one: two shares of one GPU add up.
    engine = api.factory.kw["bind"]
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite writes a batch as one executemany (it locks the whole database)")
    add_node(api.factory, "n1", gpus=4)
    pair, half, other = (
        _submit(api, gpus=2),
        _submit(api, gpu_share=0.5),
        _submit(api, gpu_share=0.25),
    )
    plan = Plan(
        placements=(
            Placement(pair, (("n1", (0, 1)),)),
            Placement(half, (("n1", (2,)),), share=0.5),
            Placement(other, (("n1", (2,)),), share=0.25),
        )
    )
    writes = []

    def seen(_conn, _cursor, statement, _parameters, _context, executemany):
        table = next(
            (
                t
                for t in ("UPDATE gpu", "INSERT INTO allocation", "INSERT INTO job_event")
                if statement.startswith(t)
            ),
            None,
        )
        if table:
            set_based = "unnest(" in statement or "json_to_recordset(" in statement
            writes.append((table, executemany, set_based))

    event.listen(engine, "before_cursor_execute", seen)
    try:
        assert _apply(api, plan).placed == [pair, half, other]
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert sorted(writes) == [
        ("INSERT INTO allocation", False, True),
        ("INSERT INTO job_event", False, True),
        ("UPDATE gpu", False, True),
    ]
    assert _allocated(api) == {0: 1000, 1: 1000, 2: 750, 3: 0}
    with api.factory() as session:
        events = session.execute(
            select(JobEvent.job_id, JobEvent.from_status, JobEvent.to_status, JobEvent.attempt)
            .where(JobEvent.to_status == JobStatus.SCHEDULED)
            .order_by(JobEvent.job_id)
        ).all()
        assert events == [
            (j, JobStatus.PENDING, JobStatus.SCHEDULED, 1) for j in (pair, half, other)
        ]
        shares = session.execute(
            select(Allocation.job_id, Gpu.index, Allocation.share_milli)
            .join(Gpu, Gpu.id == Allocation.gpu_id)
            .order_by(Allocation.job_id, Gpu.index)
        ).all()
        assert shares == [(pair, 0, 1000), (pair, 1, 1000), (half, 2, 500), (other, 2, 250)]
        release(session, job_id=pair)  # a release of several GPUs takes the same path
        session.commit()
    assert _allocated(api) == {0: 0, 1: 0, 2: 750, 3: 0}


def test_an_overbooked_share_skips_only_its_job_in_a_batch(api):
    # The GPU's check constraint refuses the batch's sum; one by one, the first two fit.
    add_node(api.factory, "n1", gpus=2)
    first, clash, third = (_submit(api, gpu_share=0.6) for _ in range(3))
    plan = Plan(
        placements=(
            Placement(first, (("n1", (0,)),), share=0.6),
            Placement(clash, (("n1", (0,)),), share=0.6),
            Placement(third, (("n1", (1,)),), share=0.6),
        )
    )
    applied = _apply(api, plan)
    assert applied.placed == [first, third] and applied.skipped == {clash: "GPU taken meanwhile"}
    assert _allocated(api) == {0: 600, 1: 600}


def test_a_stale_lease_token_writes_nothing(api):
    add_node(api.factory, "n1", gpus=1)
    job_id = _submit(api)
    now = utcnow()
    with api.factory() as session:
        old = lease_taken(session, holder="a", now=now, ttl_s=1)
        # "a" stalls past its lease; "b" takes over (token + 1).
        assert lease_taken(session, holder="b", now=now + timedelta(seconds=2), ttl_s=30) == old + 1
        ctx = read_snapshot(session=session, now=now, half_life_s=3600)
        session.rollback()
        applied = apply_plan(
            session,
            ctx=ctx,
            plan=Plan(placements=(Placement(job_id, (("n1", (0,)),)),)),
            token=old,
            now=now,
        )
    assert applied.lease_lost and applied.placed == []
    assert _allocated(api) == {0: 0}


def test_preemption_hands_gpus_over_and_dispatch_waits_for_the_victim(api):
    add_node(api.factory, "n1", gpus=1)
    victim = _submit(api, user="bob", preemptible=True)
    _apply(api, Plan(placements=(Placement(victim, (("n1", (0,)),)),)))
    with api.factory() as session:
        job = session.get(Job, victim)
        transition(session, job=job, to=JobStatus.RUNNING, actor="t")
        session.commit()
    urgent = _submit(api)
    applied = _placed_behind(api, urgent, victim, "quota reclaim")
    assert applied.placed == [urgent]
    assert [(s.node, s.reason) for s in applied.stops] == [("n1", "preempt")]
    assert applied.dispatches == []  # not while the victim still runs on the GPU
    assert _allocated(api) == {0: 1000}  # handed over, never double-counted
    with api.factory() as session:
        assert session.get(Job, urgent).dispatch_after == [[victim, 1]]
        owners = session.scalars(select(Allocation.job_id).where(Allocation.released_at.is_(None)))
        assert list(owners) == [urgent]
        # The victim exits (SIGTERM honoured) and is requeued; the gate opens.
        job_finished(
            session=session,
            report=Finished(job_id=victim, attempt=1, node="n1", result="PREEMPTED"),
        )
        assert session.get(Job, victim).status == JobStatus.PENDING
        runs = released_gates(session)
        session.commit()
    assert [(d.node, d.job_id, d.gpu_indices) for d in runs] == [("n1", urgent, (0,))]
    with api.factory() as session:
        assert session.get(Job, urgent).dispatch_after is None
        assert released_gates(session) == []


def test_the_gate_opens_when_the_victim_is_placed_again_before_it_is_looked_at(api):
    # Requeued at once and placed on other GPUs, the victim is active again on a later
    # attempt: its job status alone kept the gate shut until that attempt ended too.
    add_node(api.factory, "n1", gpus=2)
    victim = _submit(api, user="bob", preemptible=True)
    _apply(api, Plan(placements=(Placement(victim, (("n1", (0,)),)),)))
    with api.factory() as session:
        transition(session, job=session.get(Job, victim), to=JobStatus.RUNNING, actor="t")
        session.commit()
    urgent = _submit(api)
    _placed_behind(api, urgent, victim, "LAS")
    with api.factory() as session:
        job_finished(
            session=session,
            report=Finished(job_id=victim, attempt=1, node="n1", result="PREEMPTED"),
        )
        session.commit()
    applied = _apply(api, Plan(placements=(Placement(victim, (("n1", (1,)),)),)))
    assert applied.placed == [victim]
    assert sorted((d.job_id, d.attempt, d.gpu_indices) for d in applied.dispatches) == sorted(
        [(victim, 2, (1,)), (urgent, 1, (0,))]
    )
    with api.factory() as session:
        assert session.get(Job, urgent).dispatch_after is None


def test_a_victim_still_in_its_grace_is_no_orphan_to_its_nodes_heartbeat(api):
    # Its GPUs went to the job that preempted it; it still runs, stopping. Taken for an
    # orphan, it was stopped as cancelled and ended CANCELLED instead of back in line.
    add_node(api.factory, "n1", gpus=1)
    victim = _submit(api, user="bob", preemptible=True)
    _apply(api, Plan(placements=(Placement(victim, (("n1", (0,)),)),)))
    with api.factory() as session:
        transition(session, job=session.get(Job, victim), to=JobStatus.RUNNING, actor="t")
        session.commit()
    urgent = _submit(api)
    _placed_behind(api, urgent, victim, "LAS")
    running = Heartbeat(node="n1", running=(AttemptRef(job_id=victim, attempt=1),))
    with api.factory() as session:
        repairs = reconcile_node_attempts(
            session=session, heartbeat=running, taken_at=utcnow(), grace_s=15
        )
        session.commit()
    assert repairs.stops == []
    # Once it has ended and been requeued, a node still running it is told to stop.
    with api.factory() as session:
        job_finished(
            session=session,
            report=Finished(job_id=victim, attempt=1, node="n1", result="PREEMPTED"),
        )
        session.commit()
        repairs = reconcile_node_attempts(
            session=session, heartbeat=running, taken_at=utcnow(), grace_s=15
        )
    assert [(s.job_id, s.attempt, s.reason) for s in repairs.stops] == [(victim, 1, "cancel")]


def test_a_victim_that_already_finished_cancels_the_gated_placement(api):
    add_node(api.factory, "n1", gpus=1)
    victim = _submit(api, user="bob", preemptible=True)
    _apply(api, Plan(placements=(Placement(victim, (("n1", (0,)),)),)))
    with api.factory() as session:
        job = session.get(Job, victim)
        for status in (JobStatus.RUNNING, JobStatus.PREEMPTED):
            transition(session, job=job, to=status, actor="t")
        settle_interrupted(session, job=job, actor="t")
        session.commit()
    urgent = _submit(api)
    applied = _placed_behind(api, urgent, victim, "quota reclaim")
    assert applied.placed == [] and urgent in applied.skipped


def test_a_full_read_renumbers_every_waiting_job(api):
    # Numbering only the head left the jobs further back with places they no longer
    # had, repeated by the jobs behind them (issue 42).
    from app.cycle.run import run_cycle
    from app.cycle.settings import SchedulerSettings

    add_node(api.factory, "n1", gpus=1)  # no telemetry: nothing is ever placed
    ids = [_submit(api) for _ in range(103)]
    settings = SchedulerSettings()

    def cycle(all_positions):
        run_cycle(
            factory=api.factory,
            messenger=NullMessenger(),
            settings=settings,
            holder="t",
            now=utcnow(),
            all_positions=all_positions,
        )
        return positions(api)

    first = cycle(True)
    assert [first[i] for i in ids] == list(range(1, len(ids) + 1))
    # Cancelling the head shifts every position by one.
    assert (
        api.client.post(f"/api/v1/jobs/{ids[0]}/cancel", headers=api.as_("alice")).status_code
        == 200
    )
    # No queue memory: a full read, whichever cycle the worker asked for.
    again = cycle(False)
    assert [again[i] for i in ids[1:]] == list(range(1, len(ids)))


def test_gates_are_looked_for_only_while_a_placed_job_waits_for_its_victims(api, monkeypatch):
    looked: list[int] = []

    def counted(session):
        looked.append(1)
        return released_gates(session)

    monkeypatch.setattr(apply_module, "released_gates", counted)
    add_node(api.factory, "n1", gpus=1)
    victim = _submit(api, user="bob", preemptible=True)
    _apply(api, Plan(placements=(Placement(victim, (("n1", (0,)),)),)))
    assert looked == []  # no job waits for a victim: no read for one
    urgent = _submit(api)
    _placed_behind(api, urgent, victim, "quota reclaim")
    assert looked == []  # its gate was set by this cycle: its victim has not exited yet
    _apply(api, Plan())
    assert looked == [1]  # the next cycle looks, while the gate is shut
