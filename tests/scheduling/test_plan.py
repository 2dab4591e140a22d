"""Whole-cycle case tables: placement, sharing, gangs, reasons, backfill, quota, preemption."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from app.scheduling import (
    JobView,
    Plan,
    PolicySettings,
    ReasonKind,
    RunningJobView,
    Snapshot,
    estimate_start,
    plan_cycle,
    planner,
)
from app.scheduling.backfill import reserved_until_s
from app.scheduling.status import Context

from .builders import T0, at, job, node, project, running, snap, window


def plan(s: Snapshot, **kw) -> Plan:  # type: ignore[no-untyped-def]
    return plan_cycle(s, now=T0, settings=PolicySettings(**kw))


def reason(p: Plan, job_id: int):  # type: ignore[no-untyped-def]
    return p.reasons()[job_id]


# ----------------------------------------------------------------- placement basics


def test_plan_cycle_is_deterministic_and_needs_aware_now() -> None:
    s = snap([node("a").gpus(8), node("b").gpus(8)], pending=[job(i, gpus=3) for i in range(6)])
    assert plan_cycle(s, now=T0) == plan_cycle(s, now=T0)
    with pytest.raises(ValueError):
        plan_cycle(s, now=T0.replace(tzinfo=None))


def test_cpu_only_job_prefers_node_without_gpus() -> None:
    s = snap([node("gpu").gpus(2), node("cpu")], pending=[job(1, gpus=0)])
    p = plan(s)
    assert p.placements[0].node_gpus == (("cpu", ()),)


def test_every_pending_job_gets_a_reason_and_position() -> None:
    s = snap([node("a").gpus(2)], pending=[job(i, gpus=2) for i in range(1, 6)])
    p = plan(s)
    assert len(p.placements) == 1
    assert sorted(r.job_id for r in p.pending) == [2, 3, 4, 5]
    assert [r.queue_position for r in p.pending] == [2, 3, 4, 5]


# ----------------------------------------------------------------- sharing


@pytest.mark.parametrize(
    ("shares", "placed"),
    [
        ((0.5, 0.5), 2),  # 500 + 500 = 1000: both on the one GPU
        ((0.6, 0.5), 1),  # 600 + 500 > 1000: second waits
        ((0.3, 0.3, 0.4), 3),  # exactly 1000 in milli, no float rounding
        ((0.1, 0.2, 0.7), 3),  # 0.1 + 0.2 + 0.7 > 1.0 in floats, = 1000 milli
    ],
)
def test_shared_gpu_sum_of_shares(shares: tuple[float, ...], placed: int) -> None:
    s = snap([node("a").gpus(1)], pending=[job(i, gpu_share=sh) for i, sh in enumerate(shares)])
    p = plan(s)
    assert len(p.placements) == placed
    assert all(pl.node_gpus == (("a", (0,)),) for pl in p.placements)


def test_shared_job_never_joins_a_whole_gpu_job_and_vice_versa() -> None:
    r = running(job(9, gpus=1), {"a": (0,)})
    s = snap([node("a").gpus(2)], pending=[job(1, gpu_share=0.5), job(2, gpus=1)], running=[r])
    p = plan(s)
    # shared job takes GPU 1 (GPU 0 is exclusively job 9's); whole job 2 then finds nothing.
    assert p.placement_for(1).node_gpus == (("a", (1,)),)  # type: ignore[union-attr]
    assert p.placement_for(2) is None


def test_shared_jobs_pack_onto_partly_used_gpu() -> None:
    r = running(job(9, gpu_share=0.5), {"a": (1,)}, share=0.5)
    s = snap([node("a").gpus(2)], pending=[job(1, gpu_share=0.5)], running=[r])
    assert plan(s).placements[0].node_gpus == (("a", (1,)),)


def test_shared_job_needs_memory_from_telemetry() -> None:
    # GPU has room by share (500 free) but telemetry says 70 of 80 GB used.
    r = running(job(9, gpu_share=0.5), {"a": (0,)}, share=0.5)
    s = snap(
        [node("a").gpus(1, mem_gb=80).used_mem(0, 70 * 1024)],
        pending=[job(1, gpu_share=0.5, gpu_memory_mb=20 * 1024)],
        running=[r],
    )
    p = plan(s)
    assert p.placements == ()
    assert reason(p, 1).kind is ReasonKind.GPU_MEMORY


# ----------------------------------------------------------------- gangs


def test_gang_over_nodes_is_all_or_nothing() -> None:
    # needs 2 nodes x 4 GPUs; only a has 4 free (b has 2): nothing placed.
    s = snap(
        [node("a").gpus(4), node("b").gpus(4).alloc(0).alloc(1)],
        pending=[job(1, gpus=4, nodes=2)],
    )
    p = plan(s, backfill=False)
    assert p.placements == ()
    assert reason(p, 1).kind is ReasonKind.WAITING_FOR_GPUS
    assert reason(p, 1).message == "waiting for 4 GPUs on each of 2 nodes (largest free block 4)"


def test_gang_placed_on_distinct_nodes() -> None:
    s = snap(
        [node("a").gpus(4), node("b").gpus(4), node("c").gpus(2)], pending=[job(1, gpus=4, nodes=2)]
    )
    p = plan(s)
    (pl,) = p.placements
    assert sorted(n for n, _ in pl.node_gpus) == ["a", "b"]
    assert all(g == (0, 1, 2, 3) for _, g in pl.node_gpus)


# ----------------------------------------------------------------- reasons


def _full(name: str, n: int = 4):  # type: ignore[no-untyped-def]
    b = node(name).gpus(n)
    for i in range(n):
        b = b.alloc(i)
    return b


@pytest.mark.parametrize(
    ("nodes", "j", "kind", "message"),
    [
        (
            [node("a").gpus(4).alloc(0).alloc(1)],
            job(1, gpus=4),
            ReasonKind.WAITING_FOR_GPUS,
            "waiting for 4 GPUs (largest free block 2)",
        ),
        (
            [node("x").gpus(4).alloc(0).alloc(1).alloc(2).foreign(3)],
            job(1, gpus=1),
            ReasonKind.FOREIGN_PROCESS,
            "GPU busy with foreign process on node x gpu 3 (90% util)",
        ),
        (
            [node("a").gpus(8)],
            job(1, gpus=9),
            ReasonKind.NEVER_FITS,
            "no node could ever fit: largest node has 8 GPUs (a)",
        ),
        (
            [node("a").gpus(8).not_ready()],
            job(1, gpus=1),
            ReasonKind.NODE_NOT_READY,
            "node a is not ready",
        ),
        (
            [node("a").gpus(8).drained()],
            job(1, gpus=1),
            ReasonKind.NODE_NOT_READY,
            "node a is drained",
        ),
        (
            [node("a").gpus(2).stale()],
            job(1, gpus=1),
            ReasonKind.TELEMETRY_STALE,
            "telemetry stale on node a gpu 0",
        ),
        (
            [node("a").gpus(2).heartbeat(600)],
            job(1, gpus=1),
            ReasonKind.TELEMETRY_STALE,
            "node a heartbeat stale (600s ago)",
        ),
        (
            [node("a").gpus(1).unhealthy(0)],
            job(1, gpus=1),
            ReasonKind.GPU_UNHEALTHY,
            "node a gpu 0 unhealthy",
        ),
        (
            [node("a").gpus(2, model="A100")],
            job(1, gpus=1, gpu_model="H100"),
            ReasonKind.GPU_MODEL_UNAVAILABLE,
            "no GPU of model H100 in the cluster (models: A100)",
        ),
        (
            # bookkeeping says free, telemetry says 60 of 80 GB used (foreign memory)
            [node("a").gpus(1).used_mem(0, 60 * 1024)],
            job(1, gpus=1, gpu_memory_mb=40 * 1024),
            ReasonKind.GPU_MEMORY,
            "waiting for 40960 MB free GPU memory on 1 GPU (most free 20480 MB)",
        ),
        (
            [node("a").gpus(2)],
            job(1, schedule_mode="at", begin_at=at(600)),
            ReasonKind.BEGIN_TIME,
            "begin time not reached",
        ),
        (
            # `--begin now+1hour` carries the client's microseconds; a message shows seconds
            [node("a").gpus(2)],
            job(1, schedule_mode="at", begin_at=at(600.123456)),
            ReasonKind.BEGIN_TIME,
            "begin time not reached",
        ),
    ],
)
def test_pending_reasons(nodes, j, kind: ReasonKind, message: str) -> None:  # type: ignore[no-untyped-def]
    p = plan(snap(nodes, pending=[j]))
    r = reason(p, j.id)
    # The head job's message also says what is reserved for it ("; GPUs reserved, ...").
    assert (r.kind, r.message.split("; ")[0]) == (kind, message)
    assert r.queue_position == 1


def test_window_closed_reason_names_the_opening() -> None:
    s = snap(
        [node("a").gpus(2)],
        pending=[job(1, schedule_mode="offpeak")],
        windows=[window("night", 13 * 3600, 19 * 3600)],
    )
    r = reason(plan(s), 1)
    assert r.kind is ReasonKind.WINDOW_CLOSED
    # The opening is data (the API's pending_until), not a time written in the message.
    assert r.message == "off-peak window closed"
    assert r.estimated_start == at(13 * 3600)


def test_offpeak_job_starts_in_open_window() -> None:
    s = snap(
        [node("a").gpus(2)],
        pending=[job(1, schedule_mode="offpeak", estimated_runtime_s=3600)],
        windows=[window("night", -60, 7200)],
    )
    assert plan(s).placements[0].job_id == 1


def test_preemptible_offpeak_job_may_use_outside_fraction() -> None:
    # 4 GPUs, 25 % may be used outside windows = 1 GPU: the 1-GPU job starts, the 2-GPU waits.
    s = snap(
        [node("a").gpus(4)],
        pending=[
            job(1, schedule_mode="offpeak", preemptible=True),
            job(2, schedule_mode="offpeak", preemptible=True, gpus=2),
            job(3, schedule_mode="offpeak", preemptible=False),
        ],
        windows=[window("night", 3600, 7200)],
    )
    p = plan(s, offpeak_outside_fraction=0.25)
    assert [pl.job_id for pl in p.placements] == [1]
    assert reason(p, 2).kind is ReasonKind.WINDOW_CLOSED
    assert reason(p, 3).kind is ReasonKind.WINDOW_CLOSED


def test_quota_reason_when_borrowing_disabled() -> None:
    r = running(job(9, project="p", gpus=2), {"a": (0, 1)})
    s = snap(
        [node("a").gpus(8)],
        pending=[job(1, project="p", gpus=1)],
        running=[r],
        projects=[project("p", quota=2)],
    )
    p = plan(s, borrowing=False)
    assert reason(p, 1).kind is ReasonKind.QUOTA
    assert reason(p, 1).message == (
        "project p would exceed its quota of 2 GPUs (using 2, borrowing disabled)"
    )
    assert plan(s).placements[0].job_id == 1  # borrowing idle GPUs is allowed by default


def test_a_gang_whose_node_ended_early_counts_only_its_running_nodes_against_quota() -> None:
    # Gang 9 asked for 2 GPUs on each of 2 nodes; its part on b ended (exit 0) and freed
    # b's GPUs (app/jobs/agent_reports.py): it holds 2 GPUs now, not 4. Project p (quota 4,
    # borrowing disabled) has 2 to go: job 1 starts. Charged for all 4, it would wait.
    gang = running(job(9, project="p", gpus=2, nodes=2), {"a": (0, 1)})
    s = snap(
        [node("a").gpus(4), node("b").gpus(4)],
        pending=[job(1, project="p", gpus=2)],
        running=[gang],
        projects=[project("p", quota=4)],
    )
    assert plan(s, borrowing=False).placements[0].job_id == 1


def test_priority_reason_when_backfill_off() -> None:
    s = snap([node("a").gpus(4).alloc(0).alloc(1)], pending=[job(1, gpus=4), job(2, gpus=1)])
    p = plan(s, backfill=False, queue_policy="fifo")
    assert p.placements == ()
    assert reason(p, 2).kind is ReasonKind.PRIORITY
    assert reason(p, 2).message == "waiting behind job 1 (strict queue order, backfill off)"


def test_gpus_that_went_to_a_job_ahead_give_the_reason_the_next_cycle_gives() -> None:
    # Said apart ("went to jobs ahead this cycle"), every job start flipped the reason of
    # each job behind, and flipped it back a cycle later: two writes per waiting job.
    first = reason(plan(snap([node("a").gpus(2)], pending=[job(1, gpus=2), job(2, gpus=2)])), 2)
    started = running(job(1, gpus=2), {"a": (0, 1)})
    s = snap([node("a").gpus(2).alloc(0).alloc(1)], pending=[job(2, gpus=2)], running=[started])
    second = reason(plan(s), 2)
    assert (first.kind, first.message) == (second.kind, second.message)
    assert first.kind is ReasonKind.WAITING_FOR_GPUS
    assert first.message == "waiting for 2 GPUs (largest free block 0)"


# ----------------------------------------------------------------- backfill


def _backfill_case() -> Snapshot:
    # One 8-GPU node, 4 GPUs busy with a job ending in 1 h (started 1 h ago, estimate 2 h).
    r = running(job(9, gpus=4, estimated_runtime_s=7200), {"a": (0, 1, 2, 3)}, started_ago_s=3600)
    return snap(
        [node("a").gpus(8)],
        running=[r],
        pending=[
            job(1, gpus=8),  # head: cannot start until job 9 ends
            job(2, gpus=2, estimated_runtime_s=1800),  # ends before the reservation: backfills
            job(3, gpus=2, estimated_runtime_s=3 * 3600),  # would delay the head
            job(4, gpus=2),  # unknown runtime: cannot prove it ends in time
            job(5, gpus=2, max_runtime_s=3000),  # limit 50 min < 1 h: backfills
        ],
    )


# Backfill cases use FIFO so that job 1 is the head; the default policy would put the
# small jobs first.


def test_backfill_reserves_for_head_and_lets_short_jobs_in() -> None:
    p = plan(_backfill_case(), queue_policy="fifo")
    assert sorted(pl.job_id for pl in p.placements) == [2, 5]
    head = reason(p, 1)
    assert head.estimated_start == at(3600)
    assert head.message.endswith("; GPUs reserved for it (see its estimated start)")
    for jid in (3, 4):
        assert reason(p, jid).kind is ReasonKind.RESERVED_BACKFILL
        assert reason(p, jid).message == "reserved for job 1 (backfill)"
        assert reason(p, jid).estimated_start is None


def test_backfill_on_gpus_the_reservation_does_not_need() -> None:
    # a: 6 of 8 busy until +1 h; b: 4 free. Head (8 GPUs) can only ever use a, so a long
    # job may take b now; a's 2 free GPUs are held for the head.
    r = running(job(9, gpus=6, estimated_runtime_s=7200), {"a": (0, 1, 2, 3, 4, 5)})
    s = snap(
        [node("a").gpus(8), node("b").gpus(4)],
        running=[r],
        pending=[job(1, gpus=8), job(2, gpus=4, estimated_runtime_s=99_999), job(3, gpus=2)],
    )
    p = plan(s, queue_policy="fifo")
    assert [(pl.job_id, pl.node) for pl in p.placements] == [(2, "b")]
    # Job 3 (2 GPUs, unknown runtime) could have used b before job 2 took it; a's free GPUs
    # are held. The ladder reports the last relaxation that fails: b taken this cycle,
    # which it says as the next cycle will (b's GPUs are taken).
    assert reason(p, 3).kind is ReasonKind.WAITING_FOR_GPUS


def test_backfill_estimate_matches_estimate_start_helper() -> None:
    s = _backfill_case()
    head = s.pending[0]
    assert estimate_start(s, head, now=T0) == at(3600)


def test_head_with_unknown_end_holds_free_gpus() -> None:
    r = running(job(9, gpus=4), {"a": (0, 1, 2, 3)})  # no estimate, no limit
    s = snap(
        [node("a").gpus(8)],
        running=[r],
        pending=[job(1, gpus=8), job(2, gpus=1, estimated_runtime_s=60)],
    )
    p = plan(s, queue_policy="fifo")
    assert p.placements == ()
    assert reason(p, 1).estimated_start is None
    assert "start time unknown" in reason(p, 1).message
    assert reason(p, 2).kind is ReasonKind.RESERVED_BACKFILL


# ----------------------------------------------------------------- quota and preemption


def _borrowed_cluster(started_ago_s: float = 7200, preemptible: bool = True) -> list:  # type: ignore[type-arg]
    return [
        running(
            job(20 + i, project="q", gpus=1, preemptible=preemptible),
            {"a": (i,)},
            started_ago_s=started_ago_s + i,  # job 23 is the oldest
        )
        for i in range(4)
    ]


def test_owner_reclaims_guaranteed_gpus_from_borrowers() -> None:
    s = snap(
        [node("a").gpus(4)],
        pending=[job(1, project="p", gpus=2)],
        running=_borrowed_cluster(),
        projects=[project("p", quota=4), project("q", quota=0)],
    )
    p = plan(s)
    # youngest borrowed jobs go first (least work lost): 20 and 21
    assert sorted(x.victim_job_id for x in p.preemptions) == [20, 21]
    assert all(x.for_job_id == 1 for x in p.preemptions)
    assert "quota: project p reclaims its guaranteed GPUs from q" in p.preemptions[0].reason
    pl = p.placement_for(1)
    assert (
        pl is not None
        and pl.node_gpus == (("a", (0, 1)),)
        and set(pl.after_preemption_of) == {20, 21}
    )


@pytest.mark.parametrize(
    ("started_ago_s", "preemptible", "quota_q", "note"),
    [
        # Victims too young (anti-loop window 600 s): the oldest, job 23, started 63 s
        # ago, so the first may be reclaimed 537 s from now (T0 12:00:00 + 8 min 57 s).
        (
            60,
            True,
            0,
            "; within quota: borrowed GPUs are reclaimed once a borrowing job has run 10 min"
            " (job 23 first)",
        ),
        # Victims not preemptible: the guarantee cannot be honoured until they end.
        (
            7200,
            False,
            0,
            "; within quota, but the GPUs borrowed by q are held by non-preemptible jobs,"
            " which run to the end",
        ),
        (7200, True, 4, ""),  # q is within its own quota: not borrowing, nothing to reclaim
    ],
)
def test_no_reclaim_when_victims_are_protected(
    started_ago_s: float, preemptible: bool, quota_q: int, note: str
) -> None:
    s = snap(
        [node("a").gpus(4)],
        pending=[job(1, project="p", gpus=2)],
        running=_borrowed_cluster(started_ago_s, preemptible),
        projects=[project("p", quota=4), project("q", quota=quota_q)],
    )
    # One LAS queue: q's jobs ran 2 h, and the default's LAS rule would stop them for
    # job 1 (a fresh job) whatever the quotas say; only the quota rule is under test.
    p = plan(s, las_thresholds_gpu_s=())
    assert p.preemptions == ()
    assert p.placements == ()
    assert reason(p, 1).message == "waiting for 2 GPUs (largest free block 0)" + note


def test_no_reclaim_note_beyond_the_quota_or_for_the_borrower_itself() -> None:
    s = snap(
        [node("a").gpus(4)],
        # 1 would take p beyond its quota of 1; 2 belongs to the borrowing project q.
        pending=[job(1, project="p", gpus=2), job(2, project="q", gpus=1)],
        running=_borrowed_cluster(started_ago_s=60),
        projects=[project("p", quota=1), project("q", quota=0)],
    )
    p = plan(s)
    assert reason(p, 1).message == "waiting for 2 GPUs (largest free block 0)"
    assert reason(p, 2).message == "waiting for 1 GPU (largest free block 0)"


def test_reclaim_note_only_for_borrowed_gpus_of_the_model_asked_for() -> None:
    s = snap(
        [node("a").gpus(4), node("b").gpus(4, model="H100")],
        pending=[
            job(1, project="p", gpus=2, gpu_model="H100"),  # q borrows only A100s
            job(2, project="p", gpus=2, gpu_model="A100"),
        ],
        running=[
            *_borrowed_cluster(started_ago_s=60),
            *(running(job(30 + i, project="r", gpus=1), {"b": (i,)}) for i in range(4)),
        ],
        projects=[project("p", quota=4), project("q", quota=0), project("r", quota=4)],
    )
    p = plan(s)
    assert reason(p, 1).message == "waiting for 2 GPUs (largest free block 0)"
    assert reason(p, 2).message.endswith("once a borrowing job has run 10 min (job 23 first)")


def test_reclaim_note_gives_the_earliest_borrower_across_gpu_models() -> None:
    s = snap(
        [node("a").gpus(4), node("b").gpus(4, model="H100")],
        pending=[job(1, project="p", gpus=1)],  # any model
        running=[
            running(job(19, project="q", gpus=1, preemptible=True), {"b": (0,)}, started_ago_s=300),
            *_borrowed_cluster(started_ago_s=60),  # q on the A100s: reclaimable from 12:08:57
            *(running(job(30 + i, project="r", gpus=1), {"b": (i,)}) for i in range(1, 4)),
        ],
        projects=[project("p", quota=4), project("q", quota=0), project("r", quota=4)],
    )
    # q's H100 job started 300 s ago: reclaimable 600 s after, at 12:05:00, first.
    assert reason(plan(s), 1).message.endswith("run 10 min (job 19 first)")


def test_project_above_quota_cannot_reclaim() -> None:
    s = snap(
        [node("a").gpus(4)],
        pending=[job(1, project="p", gpus=2)],
        running=_borrowed_cluster(),
        projects=[project("p", quota=1), project("q", quota=0)],
    )
    # One LAS queue, so that only the quota rule could stop q's jobs (see above).
    assert plan(s, las_thresholds_gpu_s=()).preemptions == ()


def test_priority_preemption_only_of_lower_priority() -> None:
    rs = [
        running(job(20, priority=1, preemptible=True, gpus=2), {"a": (0, 1)}),
        running(job(21, priority=5, preemptible=True, gpus=2), {"a": (2, 3)}),
    ]
    s = snap([node("a").gpus(4)], pending=[job(1, priority=5, gpus=2)], running=rs)
    p = plan(s)
    assert [x.victim_job_id for x in p.preemptions] == [20]
    assert p.preemptions[0].reason == "priority: job 1 (priority 5) > 1"
    assert plan(s, preemption=False).preemptions == ()
    assert plan(s, queue_policy="fifo").preemptions == ()  # fifo never preempts for priority


def test_a_job_that_outranks_young_preemptible_jobs_is_told_when_it_may_preempt() -> None:
    # Jobs 20 (priority 1) and 21 (priority 3) started 60 and 120 s ago: inside the
    # anti-loop window (600 s). Job 1 (priority 5) outranks both; the older, 21, may be
    # stopped 480 s from T0 (12:00:00 + 8 min). Job 2 (priority 2) outranks only 20,
    # which may be stopped 540 s from T0. Job 3 (priority 1) outranks neither.
    rs = [
        running(job(20, priority=1, preemptible=True, gpus=2), {"a": (0, 1)}, started_ago_s=60),
        running(job(21, priority=3, preemptible=True, gpus=2), {"a": (2, 3)}, started_ago_s=120),
    ]
    pending = [job(1, priority=5, gpus=2), job(2, priority=2, gpus=2), job(3, priority=1, gpus=1)]
    p = plan(snap([node("a").gpus(4)], pending=pending, running=rs))
    assert p.preemptions == ()
    note = "; lower-priority preemptible jobs may be preempted for it once they have run 10 min"
    assert reason(p, 1).message.endswith(f"{note} (job 21 first)")
    assert reason(p, 2).message.endswith(f"{note} (job 20 first)")
    assert reason(p, 3).message == "waiting for 1 GPU (largest free block 0)"
    # Without preemption, or under a policy that does not preempt for priority: no note.
    for settings in ({"preemption": False}, {"queue_policy": "fifo"}):
        assert (
            "preempted for it"
            not in reason(
                plan(snap([node("a").gpus(4)], pending=pending, running=rs), **settings), 1
            ).message
        )


def test_las_preempts_jobs_with_much_more_service() -> None:
    # job 20 has run 2 h on 4 GPUs = 28,800 GPU-s -> LAS queue 1; new job 1 is in queue 0.
    rs = [running(job(20, gpus=4, preemptible=True), {"a": (0, 1, 2, 3)}, started_ago_s=7200)]
    s = snap([node("a").gpus(4)], pending=[job(1, gpus=4)], running=rs)
    p = plan(s, queue_policy="las")
    assert [x.victim_job_id for x in p.preemptions] == [20]
    assert p.preemptions[0].reason == "las: job 1 attained less service (queue 0 < 1)"
    # same attained level: no preemption
    s2 = snap([node("a").gpus(4)], pending=[job(1, gpus=4, attained_gpu_s=5000)], running=rs)
    assert plan(s2, queue_policy="las").preemptions == ()


def test_a_search_dominated_by_a_failed_one_is_not_run() -> None:
    # Job 1 (4 GPUs) finds no victims: only job 20's 2 GPUs may be stopped. Job 2 asks
    # for more (4 GPUs with 40 GB each) under the same rules, so it fails too without a
    # scan; job 3 (2 GPUs) is easier and is searched, and stops job 20.
    rs = [
        running(job(20, priority=1, preemptible=True, gpus=2), {"a": (0, 1)}),
        running(job(21, priority=5, preemptible=False, gpus=2), {"a": (2, 3)}),
    ]
    pending = [
        job(1, priority=5, gpus=4),
        job(2, priority=5, gpus=4, gpu_memory_mb=40_000),
        job(3, priority=5, gpus=2),
    ]
    s = snap([node("a").gpus(4)], pending=pending, running=rs)
    ctx = Context(now=T0, settings=PolicySettings(queue_policy="priority"), windows=())
    cycle = planner.build(s, ctx, 0)
    p = planner.run(cycle)
    assert (cycle.preempt_attempts, cycle.victim_scans) == (3, 2)
    assert [(x.victim_job_id, x.for_job_id) for x in p.preemptions] == [(20, 3)]
    assert p == plan(s, queue_policy="priority")  # the same plan as the plain cycle


def test_reservation_and_preemption_together_never_double_book() -> None:
    rs = [running(job(20, priority=1, preemptible=True, gpus=4), {"a": (0, 1, 2, 3)})]
    s = snap(
        [node("a").gpus(4)],
        pending=[job(1, priority=5, gpus=4), job(2, priority=5, gpus=4)],
        running=rs,
    )
    p = plan(s)
    assert [pl.job_id for pl in p.placements] == [1]
    assert len(p.preemptions) == 1


def test_estimated_start_helper_none_without_runtimes() -> None:
    r = running(job(9, gpus=8), {"a": tuple(range(8))})
    s = snap([node("a").gpus(8)], running=[r])
    assert estimate_start(s, job(1, gpus=8), now=T0) is None
    assert estimate_start(s, job(1, gpus=8), now=T0 + timedelta(days=1)) is None


def test_preemption_never_frees_an_unhealthy_gpu_for_the_job() -> None:
    # Both GPUs fully ours (GPU filters deferred at build); GPU 0 is unhealthy. The victim on
    # GPU 0 is younger (would go first) but freeing it is useless: job 21 on GPU 1 is chosen.
    rs = [
        running(job(20, priority=0, preemptible=True), {"a": (0,)}, started_ago_s=1000),
        running(job(21, priority=0, preemptible=True), {"a": (1,)}, started_ago_s=5000),
    ]
    s = snap([node("a").gpus(2).unhealthy(0)], pending=[job(1, priority=5)], running=rs)
    p = plan(s)
    assert [x.victim_job_id for x in p.preemptions] == [21]
    assert p.placements[0].node_gpus == (("a", (1,)),)


def test_seed_only_breaks_exact_ties_deterministically() -> None:
    s = snap([node(n).gpus(2) for n in "abcd"], pending=[job(1, gpus=2)])
    assert plan_cycle(s, now=T0, seed=0).placements[0].node == "a"  # snapshot order
    picks = {plan_cycle(s, now=T0, seed=k).placements[0].node for k in range(1, 30)}
    assert len(picks) > 1  # different seeds spread ties over equal nodes
    assert plan_cycle(s, now=T0, seed=7) == plan_cycle(s, now=T0, seed=7)


def test_gpu_memory_request_skips_gpu_with_foreign_memory() -> None:
    # GPU 0 has 70 GB of someone else's memory (but low util, idle long enough): the
    # 20 GB job goes to GPU 1, by telemetry, although bookkeeping says both are free.
    n = node("a").gpus(2).used_mem(0, 70 * 1024)
    p = plan(snap([n], pending=[job(1, gpu_memory_mb=20 * 1024)]))
    assert p.placements[0].node_gpus == (("a", (1,)),)


def test_model_request_picks_matching_node() -> None:
    s = snap(
        [node("a").gpus(8, model="A100"), node("b").gpus(8, model="H100")],
        pending=[job(1, gpus=2, gpu_model="H100")],
    )
    assert plan(s).placements[0].node == "b"


def test_cpu_only_gang_needs_ready_nodes() -> None:
    s = snap([node("a").gpus(1), node("b").gpus(1).not_ready()], pending=[job(1, gpus=0, nodes=2)])
    p = plan(s)
    assert p.placements == ()
    assert reason(p, 1).kind is ReasonKind.NODE_NOT_READY


def _default_preempts(pending: JobView, rs: list[RunningJobView], **kw) -> list[int]:  # type: ignore[no-untyped-def]
    s = snap([node("a").gpus(4)], pending=[pending], running=rs)
    return [x.victim_job_id for x in plan(s, **kw).preemptions]


def test_default_stops_a_job_only_where_the_preemption_pays_for_its_cost() -> None:
    # Job 20 has run 2 h on 4 GPUs (LAS queue 1); new job 1 (queue 0) may stop it.
    long_run = job(20, gpus=4, preemptible=True)
    rs = [running(long_run, {"a": (0, 1, 2, 3)}, started_ago_s=7200)]
    assert _default_preempts(job(1, gpus=4), rs) == [20]
    # It must have run preempt_after_cost x the cost: 2 x 3700 s > its 2 h.
    assert _default_preempts(job(1, gpus=4), rs, preemption_cost_s=3700) == []
    # Expected to end within preempt_remaining_cost x the cost (2 h 5 min estimated,
    # 5 min left, 300 s cost x 2): not stopped; with 2 h left it is.
    soon = replace(long_run, estimated_runtime_s=7500)
    rs_soon = [running(soon, {"a": (0, 1, 2, 3)}, started_ago_s=7200)]
    assert _default_preempts(job(1, gpus=4), rs_soon, preempt_remaining_cost=2) == []
    later = replace(long_run, estimated_runtime_s=14_400)
    rs_later = [running(later, {"a": (0, 1, 2, 3)}, started_ago_s=7200)]
    assert _default_preempts(job(1, gpus=4), rs_later, preempt_remaining_cost=2) == [20]
    # A job that outran its estimate counts as long.
    over = replace(long_run, estimated_runtime_s=3600)
    rs_over = [running(over, {"a": (0, 1, 2, 3)}, started_ago_s=7200)]
    assert _default_preempts(job(1, gpus=4), rs_over, preempt_remaining_cost=2) == [20]
    # Service from earlier runs counts: 9 h 5 min estimated, 7 h served before this
    # run of 2 h, so 5 min left.
    served = replace(long_run, estimated_runtime_s=9 * 3600 + 300, attained_gpu_s=4 * 7 * 3600.0)
    rs_served = [running(served, {"a": (0, 1, 2, 3)}, started_ago_s=7200)]
    assert _default_preempts(job(1, gpus=4), rs_served, preempt_remaining_cost=2) == []
    assert _default_preempts(job(1, gpus=4), rs_served) == [20]
    # The cost guard is the default policy's: las stops the young job regardless.
    assert _default_preempts(job(1, gpus=4), rs, queue_policy="las", preemption_cost_s=3700) == [20]


def test_a_promoted_job_goes_first_but_stops_only_jobs_with_more_service() -> None:
    # Job 1 ran 2 h on 4 GPUs (queue 1), was preempted 9 h ago: promoted (>= 4 x 2 h).
    promoted = job(1, gpus=4, attained_gpu_s=4 * 7200.0, last_preempted_at=T0 - timedelta(hours=9))
    # Job 20 has run 3 h (43,200 GPU-s: queue 2); job 21 1.5 h (21,600: queue 1).
    more = [running(job(20, gpus=4, preemptible=True), {"a": (0, 1, 2, 3)}, started_ago_s=10_800)]
    same = [running(job(21, gpus=4, preemptible=True), {"a": (0, 1, 2, 3)}, started_ago_s=5400)]
    assert _default_preempts(promoted, more) == [20]
    assert _default_preempts(promoted, same) == []
    # Tiresias' way (promoted_may_preempt): its promoted queue 0 stops queue 1 too.
    assert _default_preempts(promoted, same, promoted_may_preempt=True) == [21]


def test_default_may_stop_only_jobs_expected_to_run_longer_than_the_newcomer() -> None:
    # Job 20 has run 2 h of an estimated 4 h (2 h left); job 1 expects 3 h, job 2 1 h.
    left_2h = job(20, gpus=4, preemptible=True, estimated_runtime_s=4 * 3600)
    rs = [running(left_2h, {"a": (0, 1, 2, 3)}, started_ago_s=7200)]
    three_h = job(1, gpus=4, estimated_runtime_s=3 * 3600)
    one_h = job(2, gpus=4, estimated_runtime_s=3600)
    assert _default_preempts(three_h, rs) == [20]  # off by default: least service rules
    assert _default_preempts(three_h, rs, preempt_shorter_only=True) == []
    assert _default_preempts(one_h, rs, preempt_shorter_only=True) == [20]
    # A newcomer with no estimate or limit may stop it (unknown: no test).
    assert _default_preempts(job(3, gpus=4), rs, preempt_shorter_only=True) == [20]


# ------------------------------------------- the simulator's walk stops when nothing fits


def test_the_walk_finds_the_next_job_that_could_fit_what_is_free() -> None:
    """With nothing to explain (the simulator), the queue walk stops placing once no job
    left could fit what is free: the fullest GPU with room and the node with most wholly
    free GPUs (`_free_room`), against each later job's share or GPUs per node."""
    order = [
        job(1, gpus=4),
        job(2, gpus=1, gpu_share=0.5),
        job(3, gpus=2),
        job(4, gpus=1, gpu_share=0.25),
    ]
    busy = job(9, gpus=1, gpu_share=0.7)
    s = snap(
        [node("a").gpus(4), node("b").gpus(2)],
        pending=order,
        running=[running(busy, {"a": (0,)}, share=0.7), running(job(8, gpus=1), {"b": (0,)})],
    )
    cs = planner.build(s, Context(now=T0, settings=PolicySettings(), windows=()), 0)
    # Free: 3 whole GPUs on a, 1 on b, so at most 1000 milli on one GPU.
    room = planner._free_room(cs)
    assert room == (1000, 3, 1000, 3)
    assert planner._first_fit(order, 0, room, None) == 1  # 4 GPUs on one node: no
    assert planner._first_fit(order, 2, room, None) == 2
    # Only 300 milli free on one GPU, no whole one: only the 250-milli share could fit.
    assert planner._first_fit(order, 0, (300, 0, 300, 0), None) == 3
    assert planner._first_fit(order, 0, (200, 1, 200, 1), None) == -1
    # Room only on GPUs reserved for a job starting in 600 s: for the jobs that end by
    # then (whole seconds, the limit included).
    timed = [job(5, gpus=1, estimated_runtime_s=601), job(6, gpus=1, max_runtime_s=600)]
    assert planner._first_fit(timed, 0, (1000, 1, 0, 0), 600) == 1
    assert planner._first_fit(timed, 0, (1000, 1, 0, 0), 599) == -1


@pytest.mark.parametrize("ahead_s", [600.5, 600.0, 599.999999, 0.2, 0.0, -0.5, 86_400 * 3 + 7.25])
def test_reserved_until_is_the_longest_run_that_ends_by_the_reservation(ahead_s: float) -> None:
    s = snap([node("a").gpus(1)])
    cs = planner.build(s, Context(now=T0, settings=PolicySettings(), windows=()), 0)
    cs.res_job, cs.res_time = 1, T0 + timedelta(seconds=ahead_s)
    limit = reserved_until_s(cs)
    assert limit is not None
    for rt in range(max(0, limit - 2), limit + 3):
        assert (rt <= limit) == (T0 + timedelta(seconds=rt) <= cs.res_time)


def test_a_deep_queue_that_cannot_fit_places_the_same_with_or_without_reasons() -> None:
    """The stop changes no decision: a queue of shares too large for the room left, then
    one that fits at its end, is placed as with every reason worked out."""
    held = [running(job(100 + i, gpus=1, gpu_share=0.8), {"a": (i,)}, share=0.8) for i in range(2)]
    pending = [job(i, gpus=1, gpu_share=0.5, estimated_runtime_s=3600) for i in range(1, 40)]
    pending.append(job(50, gpus=1, gpu_share=0.2, estimated_runtime_s=60))
    s = snap([node("a").gpus(2)], pending=pending, running=held)
    quiet = plan_cycle(s, now=T0, settings=PolicySettings(explain=False))
    full = plan_cycle(s, now=T0, settings=PolicySettings())
    assert [p.job_id for p in quiet.placements] == [p.job_id for p in full.placements] == [50]
