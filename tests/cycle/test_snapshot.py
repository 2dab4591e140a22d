"""Phase 1 against a real database: what the pure core is told about usage and placements."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import insert, select, text, update

from app.cycle.snapshot import QueueMemory, ViewCache, _kept_views, attempt_of, read_snapshot
from app.db import utcnow
from app.jobs.models import Job
from app.nodes.models import Allocation, Gpu, Node
from app.nodes.telemetry import register_node
from app.scheduling import GpuView, RunningJobView
from app.wire import GpuInfo, Register
from tests.foundation.builders import add_node, insert_jobs
from tests.support.statements import statements_sent

HALF_LIFE_S = 3600.0


def _submit(api, user="alice", **body):
    body.setdefault("command", ["train"])
    r = api.client.post("/api/v1/jobs", json=body, headers=api.as_(user))
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _allocation(job_id: int, gpu: Gpu, **times_and_share) -> Allocation:
    """Attempt 1 of the job on one GPU."""
    return Allocation(
        job_id=job_id, attempt=1, node_id=gpu.node_id, gpu_id=gpu.id, **times_and_share
    )


def test_usage_attained_service_and_placements_come_from_allocations(api):
    add_node(api.factory, "n1", gpus=2)
    finished_job, running_job, waiting_job = _submit(api), _submit(api), _submit(api)
    now = utcnow()
    with api.factory() as session:
        gpu = {g.index: g for g in session.scalars(select(Gpu))}
        # One finished attempt: 1 GPU for 2 h, ended one half-life ago (counts half).
        finished = session.get(Job, finished_job)
        finished.status, finished.attempt = "SUCCEEDED", 1
        session.add(
            _allocation(
                finished_job,
                gpu[0],
                share_milli=1000,
                created_at=now - timedelta(hours=3),
                released_at=now - timedelta(hours=1),
            )
        )
        # The waiting job ran a half-GPU attempt for 1 h before being preempted.
        waiting = session.get(Job, waiting_job)
        waiting.attempt = 1
        session.add(
            _allocation(
                waiting_job,
                gpu[1],
                share_milli=500,
                created_at=now - timedelta(hours=2),
                released_at=now - timedelta(hours=1),
            )
        )
        # The running job holds GPU 1 since 30 min.
        running = session.get(Job, running_job)
        running.status, running.attempt = "RUNNING", 1
        running.started_at = now - timedelta(minutes=30)
        session.add(
            _allocation(
                running_job, gpu[1], share_milli=1000, created_at=now - timedelta(minutes=30)
            )
        )
        session.commit()
        ctx = read_snapshot(session=session, now=now, half_life_s=HALF_LIFE_S)

    usage = {p.name: p.usage_gpu_s for p in ctx.snapshot.projects}
    # 2 h x 1 GPU x 0.5 + 1 h x 0.5 GPU x 0.5 + 0.5 h x 1 GPU (running: no decay yet)
    assert usage["ml"] == pytest.approx(3600 + 900 + 1800, rel=1e-3)
    assert [j.id for j in ctx.snapshot.pending] == [waiting_job]
    assert ctx.snapshot.pending[0].attained_gpu_s == pytest.approx(1800, rel=1e-3)
    assert [(r.job.id, r.placement) for r in ctx.snapshot.running] == [
        (running_job, (("n1", (1,)),))
    ]
    assert {i: attempt_of(row) for i, row in ctx.pending_rows.items()} == {waiting_job: 1}


def test_a_jobs_grace_period_counts_towards_how_long_it_may_hold_its_gpus(api):
    """Stopped at its time limit, a job may take its grace period to exit: backfill must
    not promise its GPUs to another job before then. The agent's default is not counted."""
    add_node(api.factory, "n1", gpus=1)
    patient = _submit(api, max_runtime_s=3600, grace_s=300)
    plain = _submit(api, max_runtime_s=3600)
    unlimited = _submit(api, grace_s=300)
    with api.factory() as session:
        ctx = read_snapshot(session=session, now=utcnow(), half_life_s=HALF_LIFE_S)
    limits = {j.id: (j.max_runtime_s, j.grace_s) for j in ctx.snapshot.pending}
    assert limits == {patient: (3900, 300), plain: (3600, 0), unlimited: (None, 300)}


@pytest.mark.parametrize("kept", [False, True], ids=["by its end", "by change-stamp"])
def test_a_quick_read_counts_the_service_of_an_attempt_that_ended_since_the_full_one(api, kept):
    # Preempted between two full reads and back in line, a job is not a newcomer: at LAS
    # queue 0 it stopped the job beside it in the next quick cycle, which was what had
    # made room for the job that preempted it. The scheduler keeps its reads' cache, and
    # on PostgreSQL the quick read then finds the ended attempt by its change-stamp.
    add_node(api.factory, "n1", gpus=1)
    job_id = _submit(api)
    start = utcnow() - timedelta(hours=1)
    with api.factory() as session:
        gpu = session.scalars(select(Gpu)).one()
        job = session.get(Job, job_id)
        job.status, job.attempt, job.started_at = "RUNNING", 1, start
        session.add(_allocation(job_id, gpu, share_milli=1000, created_at=start))
        session.commit()
        memory = QueueMemory()
        views = memory.views if kept else None
        full = read_snapshot(session=session, now=utcnow(), half_life_s=HALF_LIFE_S, views=views)
        memory.remember(full, ())
        # Preempted: its attempt ends and it is back in the queue.
        ended = utcnow()
        session.execute(
            update(Allocation).where(Allocation.job_id == job_id).values(released_at=ended)
        )
        job.status, job.pending_reason = "PENDING", "NEW"
        session.commit()
        for _ in range(2):  # each quick read counts it once
            quick = read_snapshot(
                session=session, now=utcnow(), half_life_s=HALF_LIFE_S, quick_from=memory,
                views=views,
            )  # fmt: skip
            assert quick.quick and [j.id for j in quick.snapshot.pending] == [job_id]
            assert quick.snapshot.pending[0].attained_gpu_s == pytest.approx(3600, rel=1e-3)
        # The next full read counts it, and a quick read after it not a second time.
        full = read_snapshot(session=session, now=utcnow(), half_life_s=HALF_LIFE_S, views=views)
        memory.remember(full, (job_id,))
        quick = read_snapshot(
            session=session, now=utcnow(), half_life_s=HALF_LIFE_S, quick_from=memory,
            views=views,
        )  # fmt: skip
    assert full.snapshot.pending[0].attained_gpu_s == pytest.approx(3600, rel=1e-3)
    assert quick.snapshot.pending[0].attained_gpu_s == pytest.approx(3600, rel=1e-3)


def test_a_gpus_lists_reach_the_core_as_tuples(api):
    # Read as the JSON's text (the cycle decodes only GPUs whose row changed).
    add_node(api.factory, "n1", gpus=3)
    with api.factory() as session:
        session.execute(
            update(Gpu)
            .where(Gpu.index == 0)
            .values(unknown_readings=["processes: NVML_ERROR_UNKNOWN"], nvlink_peers=[1, 2])
        )
        session.execute(update(Gpu).where(Gpu.index == 1).values(unknown_readings=None))
        session.commit()
        ctx = read_snapshot(session=session, now=utcnow(), half_life_s=HALF_LIFE_S)
    sick, plain, fresh = ctx.snapshot.nodes[0].gpus
    assert sick.unknown == ("processes: NVML_ERROR_UNKNOWN",) and not sick.healthy
    assert sick.nvlink_peers == (1, 2)
    for gpu in (plain, fresh):
        assert gpu.unknown == () and gpu.nvlink_peers == () and gpu.healthy


def test_a_gpu_whose_row_did_not_change_keeps_its_view(api):
    # At 1,000 nodes, making every GPU's view anew was a fifth of each snapshot.
    add_node(api.factory, "n1", gpus=2)
    cache = ViewCache()
    with api.factory() as session:

        def gpus():
            ctx = read_snapshot(session=session, now=utcnow(), half_life_s=HALF_LIFE_S, views=cache)
            session.rollback()
            return ctx.snapshot.nodes[0].gpus

        first = gpus()
        assert all(a is b for a, b in zip(gpus(), first, strict=True))
        session.execute(update(Gpu).where(Gpu.index == 1).values(util_pct=73.0))
        session.commit()
        kept, changed = gpus()
    assert kept is first[0]
    assert changed is not first[1] and changed.util_pct == 73.0


def test_a_running_job_whose_row_did_not_change_keeps_its_view(api):
    # At 1,000 nodes, thousands of running jobs' views made anew each cycle.
    add_node(api.factory, "n1", gpus=2)
    steady, touched = _submit(api), _submit(api)
    cache = ViewCache()
    with api.factory() as session:
        gpu = {g.index: g for g in session.scalars(select(Gpu))}
        for job_id, index in ((steady, 0), (touched, 1)):
            job = session.get(Job, job_id)
            job.status, job.attempt, job.started_at = "RUNNING", 1, utcnow()
            session.add(_allocation(job_id, gpu[index], share_milli=1000, created_at=utcnow()))
        session.commit()

        def running():
            ctx = read_snapshot(session=session, now=utcnow(), half_life_s=HALF_LIFE_S, views=cache)
            session.rollback()
            return {r.job.id: r for r in ctx.snapshot.running}

        first = running()
        assert cache.running_read == 2
        assert all(first[i].job is again.job for i, again in running().items())
        assert cache.running_read == 0  # their change-stamps only
        session.execute(update(Job).where(Job.id == touched).values(estimated_runtime_s=600))
        session.commit()
        later = running()
        assert cache.running_read == 1
    assert later[steady].job is first[steady].job
    assert later[touched].job is not first[touched].job
    assert later[touched].job.estimated_runtime_s == 600
    assert [(r.job.id, r.placement) for r in later.values()] == [
        (steady, (("n1", (0,)),)),
        (touched, (("n1", (1,)),)),
    ]


def _postgresql_only(session) -> None:
    if session.get_bind().dialect.name != "postgresql":
        pytest.skip("SQLite's cycle reads every GPU and allocation (changed_in is PostgreSQL's)")


def _gpus(api, cache: ViewCache) -> dict[tuple[str, int], GpuView]:
    with api.factory() as session:
        ctx = read_snapshot(session=session, now=utcnow(), half_life_s=HALF_LIFE_S, views=cache)
    return {(node.name, gpu.index): gpu for node in ctx.snapshot.nodes for gpu in node.gpus}


def test_a_cycle_reads_only_the_gpus_changed_since_its_last_read(api):
    # At 1,000 nodes x 8 GPUs, reading every GPU was the largest part of each snapshot.
    with api.factory() as session:
        _postgresql_only(session)
    add_node(api.factory, "n1", gpus=2)
    add_node(api.factory, "n2", gpus=2)
    cache = ViewCache()
    first = _gpus(api, cache)
    assert cache.gpus_read == 4
    with statements_sent(api.factory) as sent:
        assert _gpus(api, cache) == first and cache.gpus_read == 0
    # One statement on the GPUs, not also a count of them (2-5 ms at 1,000 nodes)
    assert len([s for s in sent if "FROM gpu" in s.statement]) == 1, sent
    with api.factory() as session:  # a heartbeat, a placement: whoever writes
        session.execute(update(Gpu).where(Gpu.uuid == "GPU-n1-1").values(util_pct=55.0))
        session.execute(text("UPDATE gpu SET allocated_milli = 500 WHERE uuid = 'GPU-n2-0'"))
        session.commit()
    later = _gpus(api, cache)
    assert cache.gpus_read == 2
    assert later[("n1", 1)].util_pct == 55.0 and later[("n2", 0)].allocated_milli == 500
    assert later[("n1", 0)] is first[("n1", 0)] and later[("n2", 1)] is first[("n2", 1)]


def test_a_gpu_write_that_commits_after_the_read_is_seen_by_the_next_one(api):
    """As for jobs (test_change_stamp): a write begun before a read and committed after
    it carries a transaction id lower than the writes the read saw."""
    with api.factory() as session:
        _postgresql_only(session)
    add_node(api.factory, "n1", gpus=2)
    cache = ViewCache()
    _gpus(api, cache)
    with api.factory() as slow:
        slow.execute(update(Gpu).where(Gpu.index == 0).values(util_pct=10.0))  # begun
        with api.factory() as quick:  # a later transaction, committed first
            quick.execute(update(Gpu).where(Gpu.index == 1).values(util_pct=20.0))
            quick.commit()
        assert _gpus(api, cache)[("n1", 1)].util_pct == 20.0
        slow.commit()
    assert _gpus(api, cache)[("n1", 0)].util_pct == 10.0


def test_a_nodes_gpus_stay_grouped_in_index_order_as_their_rows_change(api):
    # The grouping by node is kept across cycles and mended where a GPU's row changed.
    add_node(api.factory, "n1", gpus=2)
    add_node(api.factory, "n2", gpus=2)
    running = _submit(api)
    with api.factory() as session:  # it holds the GPU about to be renumbered
        job = session.get(Job, running)
        job.status, job.attempt, job.started_at = "RUNNING", 1, utcnow()
        gpu = session.scalars(select(Gpu).where(Gpu.uuid == "GPU-n2-0")).one()
        session.add(_allocation(running, gpu, share_milli=1000, created_at=utcnow()))
        session.commit()
    cache = ViewCache()

    def read():
        with api.factory() as session:
            ctx = read_snapshot(session=session, now=utcnow(), half_life_s=HALF_LIFE_S, views=cache)
        assert [r.job.id for r in ctx.snapshot.running] == [running]
        placement = ctx.snapshot.running[0].placement
        return {node.name: node.gpus for node in ctx.snapshot.nodes}, ctx.gpu_ids, placement

    first, _, placement = read()
    assert placement == (("n2", (0,)),)
    with api.factory() as session:
        session.execute(update(Gpu).where(Gpu.uuid == "GPU-n1-1").values(util_pct=55.0))
        # Renumbered (a node that registers again with its GPUs in another order).
        session.execute(update(Gpu).where(Gpu.uuid == "GPU-n2-0").values(index=5))
        session.commit()
        moved = session.scalar(select(Gpu.id).where(Gpu.uuid == "GPU-n2-0"))
        n2 = session.scalar(select(Node.id).where(Node.name == "n2"))
    later, gpu_ids, placement = read()
    assert placement == (("n2", (5,)),)
    assert [(g.uuid, g.index, g.util_pct) for g in later["n1"]] == [
        ("GPU-n1-0", 0, first["n1"][0].util_pct),
        ("GPU-n1-1", 1, 55.0),
    ]
    assert [(g.uuid, g.index) for g in later["n2"]] == [("GPU-n2-1", 1), ("GPU-n2-0", 5)]
    assert gpu_ids[n2, 5] == moved and (n2, 0) not in gpu_ids
    with api.factory() as session:
        session.execute(update(Gpu).where(Gpu.uuid == "GPU-n1-0").values(util_pct=12.0))
        session.commit()
    again, _, _ = read()
    assert again["n1"][0].util_pct == 12.0 and again["n2"] == later["n2"]
    with api.factory() as session:
        _postgresql_only(session)
    assert again["n2"] is later["n2"]  # a node none of whose GPUs changed: as it was


def _registers(api, node: str, *uuids: str) -> None:
    """`node`'s agent starts with `uuids`' GPUs, as the reports worker stores it."""
    gpus = tuple(
        GpuInfo(index=index, uuid=uuid, model="H100-80GB", memory_total_mb=81559)
        for index, uuid in enumerate(uuids)
    )
    with api.factory.begin() as session:
        register_node(session=session, report=Register(node=node, gpus=gpus))


def test_gpus_added_lost_and_of_removed_nodes_leave_the_next_read_right(api):
    _registers(api, "n1", "A", "B")
    _registers(api, "n2", "C", "D")
    cache = ViewCache()
    _gpus(api, cache)
    _registers(api, "n1", "B")  # A lost: its row stays, unhealthy, after the reported
    _registers(api, "n2", "C", "D", "E")
    gpus = _gpus(api, cache)
    assert {key: (gpu.uuid, gpu.healthy) for key, gpu in gpus.items()} == {
        ("n1", 0): ("B", True),
        ("n1", 1): ("A", False),
        ("n2", 0): ("C", True),
        ("n2", 1): ("D", True),
        ("n2", 2): ("E", True),
    }
    assert list(gpus) == sorted(gpus)
    with api.factory() as session:
        session.execute(update(Node).where(Node.name == "n1").values(removed_at=utcnow()))
        session.commit()
    assert list(_gpus(api, cache)) == [("n2", 0), ("n2", 1), ("n2", 2)]


def test_a_nodes_labels_and_unusable_accounts_reach_the_core_sorted(api):
    # Read as the JSON's text and decoded once per distinct text.
    add_node(api.factory, "n1", gpus=1)
    add_node(api.factory, "n2", gpus=1)
    with api.factory() as session:
        session.execute(
            update(Node)
            .where(Node.name == "n1")
            .values(labels={"rack": "a", "ib": "hdr"}, unusable_accounts={"bob": "no such user"})
        )
        session.commit()
        ctx = read_snapshot(session=session, now=utcnow(), half_life_s=HALF_LIFE_S)
    n1, n2 = ctx.snapshot.nodes
    assert n1.labels == (("ib", "hdr"), ("rack", "a"))
    assert n1.unusable_accounts == (("bob", "no such user"),)
    assert n2.labels == () and n2.unusable_accounts == ()


def _running(api, cache: ViewCache) -> dict[int, RunningJobView]:
    """Each running job's view, as a full read with `cache` gives it."""
    with api.factory() as session:
        ctx = read_snapshot(session=session, now=utcnow(), half_life_s=HALF_LIFE_S, views=cache)
    return {r.job.id: r for r in ctx.snapshot.running}


def _placements(running: dict[int, RunningJobView]) -> dict[int, tuple[Any, ...]]:
    return {job_id: view.placement for job_id, view in running.items()}


def _start(api, job_id: int, index: int) -> None:
    """Attempt 1 of the job runs on GPU `index` of the one node."""
    with api.factory() as session:
        gpu = session.scalars(select(Gpu).where(Gpu.index == index)).one()
        job = session.get(Job, job_id)
        job.status, job.attempt, job.started_at = "RUNNING", 1, utcnow()
        session.add(_allocation(job_id, gpu, share_milli=1000, created_at=utcnow()))
        session.commit()


def test_a_cycle_reads_only_the_allocations_placed_or_released_since_its_last_read(api):
    # At 1,000 nodes, the 8,000 allocations held were read and summed anew each cycle,
    # and as many running views made anew.
    add_node(api.factory, "n1", gpus=3)
    first, second, third = _submit(api), _submit(api), _submit(api)
    _start(api, first, 0)
    _start(api, second, 1)
    cache = ViewCache()
    before = _running(api, cache)
    assert _placements(before) == {first: (("n1", (0,)),), second: (("n1", (1,)),)}
    assert cache.allocations_read == 2
    with api.factory() as session:
        _postgresql_only(session)
    again = _running(api, cache)
    assert cache.allocations_read == 0
    assert all(again[i] is before[i] for i in (first, second))
    _start(api, third, 2)
    with api.factory() as session:  # the first ends
        session.execute(
            update(Allocation).where(Allocation.job_id == first).values(released_at=utcnow())
        )
        session.execute(update(Job).where(Job.id == first).values(status="SUCCEEDED"))
        session.commit()
    later = _running(api, cache)
    assert cache.allocations_read == 2
    assert _placements(later) == {second: (("n1", (1,)),), third: (("n1", (2,)),)}
    assert later[second] is before[second]


def test_the_allocations_changed_are_read_without_reading_every_job(api):
    """Each allocation's project is its job's. Joined to the job table, after a burst of
    submissions (the planner's statistics stale), PostgreSQL hashed every job to match
    the few allocations changed since the last read: 8 ms of each cycle at 1,000 nodes."""
    with api.factory() as session:
        _postgresql_only(session)
    add_node(api.factory, "n1", gpus=1)
    running = _submit(api)
    ended = insert_jobs(api.factory, user="alice", project="default", count=3000)
    with api.factory.begin() as session:
        gpu = session.scalars(select(Gpu)).one()
        session.execute(update(Job).where(Job.id.in_(ended)).values(status="SUCCEEDED"))
        session.execute(
            insert(Allocation),
            [
                dict(
                    job_id=job_id,
                    attempt=1,
                    node_id=gpu.node_id,
                    gpu_id=gpu.id,
                    share_milli=1000,
                    created_at=utcnow(),
                    released_at=utcnow(),
                )
                for job_id in ended
            ],
        )
    cache = ViewCache()
    _running(api, cache)
    _start(api, running, 0)
    with statements_sent(api.factory) as sent:
        assert set(_running(api, cache)) == {running}
    assert cache.allocations_read == 1
    read = [s for s in sent if "FROM allocation" in s.statement and "changed_in" in s.statement]
    assert len(read) == 1, sent
    with api.factory() as session:
        explain = "EXPLAIN " + read[0].statement
        plan = "\n".join(
            session.connection().exec_driver_sql(explain, read[0].parameters).scalars()
        )
    assert "Seq Scan on job" not in plan, plan


def test_an_allocation_released_after_the_read_began_is_seen_by_the_next_one(api):
    """As for GPUs: a release begun before a read and committed after it carries a
    transaction id lower than the writes that read saw."""
    with api.factory() as session:
        _postgresql_only(session)
    add_node(api.factory, "n1", gpus=2)
    ending, starting = _submit(api), _submit(api)
    _start(api, ending, 0)
    cache = ViewCache()
    _running(api, cache)
    with api.factory() as slow:
        slow.execute(
            update(Allocation).where(Allocation.job_id == ending).values(released_at=utcnow())
        )
        slow.execute(update(Job).where(Job.id == ending).values(status="SUCCEEDED"))
        _start(api, starting, 1)  # a later transaction, committed first
        assert set(_running(api, cache)) == {ending, starting}
        slow.commit()
    assert set(_running(api, cache)) == {starting}
    assert cache.held is not None
    assert [allocation[1] for allocation in cache.held.values()] == [starting]


def test_an_allocation_deleted_while_held_leaves_the_next_read(api):
    # Deleting a job removes its allocations and leaves no change-stamp behind.
    add_node(api.factory, "n1", gpus=2)
    kept, deleted = _submit(api), _submit(api)
    _start(api, kept, 0)
    _start(api, deleted, 1)
    cache = ViewCache()
    assert set(_running(api, cache)) == {kept, deleted}
    with api.factory() as session:
        session.execute(text("DELETE FROM allocation WHERE job_id = :id"), {"id": deleted})
        session.commit()
    assert _placements(_running(api, cache)) == {kept: (("n1", (0,)),), deleted: ()}
    assert cache.held is not None and len(cache.held) == 1


def test_the_held_count_is_read_with_the_changed_allocations(api):
    # In one statement, so in one view of the database: read apart, a release committed
    # between the two made the count differ from the held ones kept (about one cycle in
    # 30 of a drain), which sent the read back to reading every held and ended one.
    with api.factory() as session:
        _postgresql_only(session)
    add_node(api.factory, "n1", gpus=2)
    first, second = _submit(api), _submit(api)
    _start(api, first, 0)
    cache = ViewCache()
    _running(api, cache)
    _start(api, second, 1)
    with statements_sent(api.factory) as sent:
        assert set(_running(api, cache)) == {first, second}
    assert cache.allocations_read == 1  # the new one only: no read of them all
    on_allocations = [s.statement for s in sent if "FROM allocation" in s.statement]
    assert len(on_allocations) == 1, on_allocations
    assert "count(*)" in on_allocations[0]


class _LookupsCounted(dict):
    """A ViewCache's waiting rows, counting the lookups made in them."""

    looked_up = 0

    def get(self, key, default=None):
        self.looked_up += 1
        return super().get(key, default)


def test_kept_views_look_only_at_the_served_jobs_still_waiting():
    # `attained` names every job served within the usage horizon (28 days by default):
    # looking each one up among the waiting, each cycle, grew with four weeks of history.
    still_waiting = SimpleNamespace(attained=5.0, row=None, view=None)
    cache = ViewCache()
    cache.rows = rows = _LookupsCounted({1: still_waiting})
    cache.served = {1}
    finished_long_ago = {job_id: 60.0 for job_id in range(2, 10_002)}
    _kept_views(cache, users={}, project_names={}, attained={1: 5.0, **finished_long_ago})
    assert rows.looked_up == 1
    assert cache.served == {1} and still_waiting.attained == 5.0


def _usage_read(api, cache: ViewCache, at) -> tuple[Any, bool]:
    """A full read at `at` with `cache`, and whether it read the ended allocations from
    the database (the whole usage horizon) rather than from those the cache keeps."""
    with statements_sent(api.factory) as sent, api.factory() as session:
        ctx = read_snapshot(session=session, now=at, half_life_s=HALF_LIFE_S, views=cache)
    return ctx, any("released_at >=" in s.statement for s in sent)


def test_a_full_read_sums_the_ended_allocations_it_keeps_as_a_whole_read_would(api):
    # The usage horizon is four half-lives, 28 days by default: read whole by every full
    # cycle, it cost about 2.5 us per allocation ended in four weeks.
    with api.factory() as session:
        _postgresql_only(session)
    add_node(api.factory, "n1", gpus=2)
    old, again, quick = _submit(api), _submit(api), _submit(api)
    now = utcnow()
    with api.factory.begin() as session:
        gpu = session.scalars(select(Gpu).where(Gpu.index == 0)).one()
        hour = timedelta(hours=1)
        leaving = now - timedelta(days=1) + timedelta(seconds=30)  # horizon: a day here
        session.add(_allocation(old, gpu, created_at=leaving - hour, released_at=leaving))
        session.add(_allocation(again, gpu, created_at=now - 2 * hour, released_at=now - hour))
    cache = ViewCache()
    first, whole = _usage_read(api, cache, now)
    assert whole and first.attained == {old: 3600.0, again: 3600.0}
    with api.factory.begin() as session:  # between two reads: one more attempt of
        gpu = session.scalars(select(Gpu).where(Gpu.index == 1)).one()
        second = _allocation(again, gpu, created_at=now - hour, released_at=now)
        second.attempt = 2
        session.add(second)  # and one placed and released before the next read saw it
        session.add(_allocation(quick, gpu, created_at=now - hour / 2, released_at=now))
    later = now + timedelta(minutes=1)  # `old`'s attempt has left the horizon
    kept, whole = _usage_read(api, cache, later)
    fresh, _ = _usage_read(api, ViewCache(), later)
    assert not whole
    assert kept.attained == {again: 7200.0, quick: 1800.0} == fresh.attained
    assert kept.attained_through == fresh.attained_through == {again: 2, quick: 1}
    assert kept.usage == pytest.approx(fresh.usage) and kept.usage
    # Rows deleted leave no change behind: now and then, the horizon is read whole again.
    assert _usage_read(api, cache, later + timedelta(minutes=10))[1]
