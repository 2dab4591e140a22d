"""The job's own choice of nodes: `only_nodes` (any of them) and `exclude_nodes`, as
`sbatch --exclude` and a Kubernetes node affinity."""

from __future__ import annotations

import pytest

from app.scheduling import PolicySettings, ReasonKind, plan_cycle
from app.scheduling.filters import node_choice

from .builders import T0, job, node, running, snap

HOUR = 3600
FIFO = PolicySettings(queue_policy="fifo")


@pytest.mark.parametrize(
    ("only", "exclude", "barred"),
    [
        (None, frozenset(), frozenset()),  # no choice: every node
        (frozenset({"b"}), frozenset(), frozenset({"a", "c"})),
        (None, frozenset({"c"}), frozenset({"c"})),
        (frozenset({"a", "b"}), frozenset({"b"}), frozenset({"b", "c"})),  # both: exclude wins
        (frozenset({"gone"}), frozenset(), frozenset({"a", "b", "c"})),  # a node since deleted
    ],
)
def test_the_nodes_a_choice_leaves_out(only, exclude, barred) -> None:  # type: ignore[no-untyped-def]
    chosen = job(1, only_nodes=only, exclude_nodes=exclude)
    assert node_choice.barred(chosen, ["a", "b", "c"]) == barred


def _placed_on(plan, job_id):  # type: ignore[no-untyped-def]
    pl = plan.placement_for(job_id)
    return None if pl is None else pl.node


def test_a_job_goes_where_it_chose_not_where_best_fit_would_put_it() -> None:
    # Best fit puts a 1-GPU job on the 1-GPU node a.
    nodes = [node("a").gpus(1), node("b").gpus(4)]
    assert _placed_on(plan_cycle(snap(nodes, pending=[job(1)]), now=T0), 1) == "a"
    for chosen in (job(1, only_nodes=frozenset({"b"})), job(1, exclude_nodes=frozenset({"a"}))):
        assert _placed_on(plan_cycle(snap(nodes, pending=[chosen]), now=T0), 1) == "b"


def test_a_job_waits_for_its_nodes_saying_so_and_others_use_the_rest() -> None:
    busy = running(job(90, gpus=4), {"a": (0, 1, 2, 3)})
    s = snap(
        [node("a").gpus(4), node("b").gpus(4)],
        pending=[job(1, gpus=2, only_nodes=frozenset({"a"})), job(2, gpus=2)],
        running=[busy],
    )
    p = plan_cycle(s, now=T0, settings=FIFO)
    assert _placed_on(p, 2) == "b"
    r = p.reasons()[1]
    assert r.kind is ReasonKind.WAITING_FOR_GPUS
    assert r.message.endswith(" (it runs only on a)"), r.message


def test_a_job_whose_nodes_were_removed_never_fits_and_says_how_to_change_it() -> None:
    # Job 1 chose nodes "old" and "older", removed since (gpusched remove-node): no cycle
    # can place it, however free a and b are. Job 2 excludes both nodes there are: a node
    # that joins later may run it, so it waits. One of job 3's nodes is left: it runs.
    s = snap(
        [node("a").gpus(4), node("b").gpus(4)],
        pending=[
            job(1, only_nodes=frozenset({"old", "older"})),
            job(2, exclude_nodes=frozenset({"a", "b"})),
            job(3, only_nodes=frozenset({"b", "old"})),
        ],
    )
    p = plan_cycle(s, now=T0)
    reasons = p.reasons()
    assert reasons[1].kind is ReasonKind.NEVER_FITS
    assert reasons[1].message == (
        "it runs only on old, older, and no such node is in the cluster now: change it with "
        "gpusched update --only-nodes"
    )
    assert reasons[2].kind is ReasonKind.WAITING_FOR_GPUS
    assert reasons[2].message.endswith(" (it excludes a, b)"), reasons[2].message
    assert _placed_on(p, 3) == "b"


def test_an_excluded_node_is_not_blamed_on_a_maintenance() -> None:
    # Room only on b, which the job excludes; a goes into maintenance (no room there anyway).
    busy = running(job(90, gpus=4), {"a": (0, 1, 2, 3)})
    s = snap(
        [node("a").gpus(4).maintenance(2 * HOUR), node("b").gpus(4)],
        pending=[job(1, max_runtime_s=8 * HOUR, exclude_nodes=frozenset({"b"}))],
        running=[busy],
    )
    r = plan_cycle(s, now=T0).reasons()[1]
    assert r.kind is ReasonKind.WAITING_FOR_GPUS
    assert r.message.endswith(" (it excludes b)"), r.message


def test_no_victim_is_preempted_on_a_node_the_job_excludes() -> None:
    victim = running(job(90, gpus=4, preemptible=True, priority=0), {"a": (0, 1, 2, 3)})
    urgent = job(1, gpus=4, priority=10)
    settings = PolicySettings(queue_policy="priority", preemption=True)
    nodes = [node("a").gpus(4)]
    p = plan_cycle(snap(nodes, pending=[urgent], running=[victim]), now=T0, settings=settings)
    assert [x.victim_job_id for x in p.preemptions] == [90]  # the control: it would
    choosy = job(1, gpus=4, priority=10, exclude_nodes=frozenset({"a"}))
    p = plan_cycle(snap(nodes, pending=[choosy], running=[victim]), now=T0, settings=settings)
    assert p.preemptions == ()
    assert p.reasons()[1].message.endswith(" (it excludes a)")
