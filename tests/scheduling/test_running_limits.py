"""Running limits per user and per project (Slurm's MaxJobs / GrpJobs and
MaxTRES / GrpTRES=gres/gpu): a job over a limit waits with a typed reason naming the
limit and the count; it does not start by backfill, does not preempt, and holds back no
other job. No limits: the same plan as without the feature."""

from __future__ import annotations

from app.scheduling import (
    Plan,
    PolicySettings,
    ProjectView,
    ReasonKind,
    Snapshot,
    UserView,
    plan_cycle,
)
from app.scheduling.filters import running_limit

from .builders import T0, job, node, project, running, snap


def plan(s: Snapshot, **kw) -> Plan:  # type: ignore[no-untyped-def]
    return plan_cycle(s, now=T0, settings=PolicySettings(**kw))


def placed(p: Plan) -> list[int]:
    return sorted(pl.job_id for pl in p.placements)


def test_fits_counts_jobs_and_thousandths_of_gpus() -> None:
    assert running_limit.fits((2, None), jobs=1, milli=0, need_milli=1000)
    assert not running_limit.fits((2, None), jobs=2, milli=0, need_milli=1000)
    assert running_limit.fits((None, 4), jobs=9, milli=2000, need_milli=2000)
    assert not running_limit.fits((None, 4), jobs=0, milli=2500, need_milli=2000)
    assert running_limit.fits((None, None), jobs=10**6, milli=10**9, need_milli=1000)
    assert not running_limit.fits((0, None), jobs=0, milli=0, need_milli=0)


def test_user_limit_counts_running_jobs_and_those_placed_this_cycle() -> None:
    s = snap(
        [node("a").gpus(8)],
        running=[running(job(9, user="alice"), {"a": (0,)})],
        pending=[job(i, user="alice") for i in (1, 2, 3)] + [job(4, user="bob")],
        users=[UserView("alice", max_running_jobs=2)],
    )
    p = plan(s, queue_policy="fifo")
    # One of alice's runs already: one more starts, the others wait; bob is not held back.
    assert placed(p) == [1, 4]
    for jid in (2, 3):
        r = p.reasons()[jid]
        assert r.kind is ReasonKind.RUNNING_LIMIT
        assert r.message == "user alice may run 2 jobs at once (2 running; a limit an admin set)"


def test_project_limit_holds_every_user_of_the_project() -> None:
    s = snap(
        [node("a").gpus(8)],
        pending=[
            job(1, user="alice", project="ml"),
            job(2, user="bob", project="ml"),
            job(3, user="carol", project="cv"),
        ],
        projects=[ProjectView("ml", max_running_jobs=1), project("cv")],
    )
    p = plan(s, queue_policy="fifo")
    assert placed(p) == [1, 3]
    r = p.reasons()[2]
    assert r.kind is ReasonKind.RUNNING_LIMIT
    assert r.message == "project ml may run 1 job at once (1 running; a limit an admin set)"


def test_gpu_limit_counts_every_gpu_of_multi_gpu_and_gang_jobs() -> None:
    s = snap(
        [node("a").gpus(8), node("b").gpus(8)],
        running=[running(job(9, user="alice", gpus=2), {"a": (0, 1)})],
        pending=[
            job(1, user="alice", gpus=2, nodes=2),  # 4 GPUs: 2 + 4 > 5
            job(2, user="alice", gpus=3),  # 2 + 3 = 5: within
            job(3, user="alice", gpus=1),  # 5 + 1 > 5
        ],
        users=[UserView("alice", max_gpus=5)],
    )
    p = plan(s, queue_policy="fifo")
    assert placed(p) == [2]
    assert p.reasons()[1].message == (
        "user alice may use 5 GPUs at once (2 in use, this job needs 4; a limit an admin set)"
    )
    assert p.reasons()[3].message == (
        "user alice may use 5 GPUs at once (5 in use, this job needs 1; a limit an admin set)"
    )


def test_shared_gpus_count_their_share() -> None:
    s = snap(
        [node("a").gpus(2)],
        pending=[job(i, user="alice", gpu_share=0.5) for i in (1, 2, 3)],
        projects=[ProjectView("default", max_gpus=1)],
    )
    p = plan(s, queue_policy="fifo")
    assert placed(p) == [1, 2]
    assert p.reasons()[3].message == (
        "project default may use 1 GPU at once (1 in use, this job needs 0.5; a limit an admin set)"
    )


def test_the_user_limit_is_named_before_the_project_limit() -> None:
    s = snap(
        [node("a").gpus(8)],
        running=[running(job(9, user="alice", project="ml"), {"a": (0,)})],
        pending=[job(1, user="alice", project="ml")],
        projects=[ProjectView("ml", max_running_jobs=1)],
        users=[UserView("alice", max_running_jobs=1)],
    )
    assert plan(s).reasons()[1].message.startswith("user alice may run 1 job at once")


def test_backfill_does_not_start_a_job_over_its_limit() -> None:
    # Job 1 (the head, 8 GPUs) waits for job 9 and holds the reservation; job 2 is short
    # enough to backfill, but its user already runs as many jobs as allowed. Job 3, of
    # another user, backfills: a held-back job holds back nobody.
    r = running(job(9, user="bob", gpus=4, estimated_runtime_s=7200), {"a": (0, 1, 2, 3)})
    s = snap(
        [node("a").gpus(8)],
        running=[r],
        pending=[
            job(1, user="carol", gpus=8),
            job(2, user="bob", gpus=2, estimated_runtime_s=600),
            job(3, user="dave", gpus=2, estimated_runtime_s=600),
        ],
        users=[UserView("bob", max_running_jobs=1)],
    )
    unlimited = plan(snap(s.nodes, pending=s.pending, running=s.running), queue_policy="fifo")
    assert placed(unlimited) == [2, 3]  # without the limit job 2 backfills
    p = plan(s, queue_policy="fifo")
    assert placed(p) == [3]
    assert p.reasons()[2].kind is ReasonKind.RUNNING_LIMIT
    assert p.reasons()[1].kind is ReasonKind.WAITING_FOR_GPUS  # the head keeps its place


def test_a_limited_job_is_not_the_backfill_head() -> None:
    # Job 1 cannot run anyway (its user is at the limit): it must not reserve the GPUs
    # that job 2 can use now.
    r = running(job(9, user="bob", gpus=4, estimated_runtime_s=7200), {"a": (0, 1, 2, 3)})
    s = snap(
        [node("a").gpus(8)],
        running=[r],
        pending=[job(1, user="bob", gpus=8), job(2, user="carol", gpus=4)],
        users=[UserView("bob", max_running_jobs=1)],
    )
    p = plan(s, queue_policy="fifo")
    assert placed(p) == [2]
    assert p.reasons()[1].kind is ReasonKind.RUNNING_LIMIT


def test_no_preemption_for_a_job_held_back_by_its_own_limit() -> None:
    # Project p is owed its quota of 4 GPUs, held by q's preemptible borrowers, but p may
    # run only 1 job at once and runs 1: nothing is preempted for its second job.
    borrowers = [
        running(job(20 + i, project="q", preemptible=True), {"a": (i,)}, started_ago_s=7200)
        for i in range(3)
    ]
    mine = running(job(10, project="p"), {"a": (3,)}, started_ago_s=7200)
    base = dict(
        nodes=[node("a").gpus(4)],
        pending=[job(1, project="p", gpus=2)],
        running=[*borrowers, mine],
    )
    free = snap(**base, projects=[project("p", quota=4), project("q")])  # type: ignore[arg-type]
    assert plan(free).preemptions  # without the limit, p reclaims its quota
    s = snap(
        **base,  # type: ignore[arg-type]
        projects=[ProjectView("p", quota_gpus=4, max_running_jobs=1), project("q")],
    )
    p = plan(s)
    assert p.preemptions == ()
    assert p.reasons()[1].kind is ReasonKind.RUNNING_LIMIT


def test_without_limits_the_plan_is_unchanged() -> None:
    s = snap(
        [node("a").gpus(4)],
        running=[running(job(9, user="alice"), {"a": (0,)})],
        pending=[job(i, user="alice", gpus=1) for i in range(1, 6)],
    )
    unlimited = plan(s)
    limits_of_none = snap(
        s.nodes,
        pending=s.pending,
        running=s.running,
        users=[UserView("alice")],
        projects=[ProjectView("default")],
    )
    # Users and projects without a limit (null) change nothing, as before.
    assert plan(limits_of_none).placements == unlimited.placements
    assert plan(limits_of_none).pending == unlimited.pending
