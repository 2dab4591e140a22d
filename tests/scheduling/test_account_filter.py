"""Nodes whose agent cannot run a job as its owner's Unix account are not the job's to use
(filters/account.py): it goes elsewhere, or waits saying which node lacks what."""

from __future__ import annotations

from app.scheduling import PolicySettings, ReasonKind, plan_cycle

from .builders import T0, job, node, snap


def _plan(nodes, pending):  # type: ignore[no-untyped-def]
    return plan_cycle(snap(nodes, pending=pending), now=T0, settings=PolicySettings())


def test_a_job_goes_to_a_node_that_has_its_owners_account() -> None:
    p = _plan([node("a").gpus(2).lacks("alice"), node("b").gpus(2)],
              [job(1, unix_user="alice"), job(2, unix_user="bob")])  # fmt: skip
    where = {pl.job_id: pl.node for pl in p.placements}
    assert where[1] == "b"  # a is first in order, but cannot run it as alice
    assert set(where) == {1, 2}


def test_with_no_node_left_it_waits_naming_each_node_and_why() -> None:
    p = _plan(
        [node("a").gpus(2).lacks("alice"), node("b").gpus(2).lacks("alice", "it has uid 0")],
        [job(1, unix_user="alice"), job(2, unix_user="bob")],
    )
    assert [pl.job_id for pl in p.placements] == [2]  # bob's job is not held back
    why = p.reasons()[1]
    assert why.kind is ReasonKind.NO_ACCOUNT
    assert why.message.startswith(
        "no node it may use can run it as Unix account 'alice' "
        "(a: no such account on this node; b: it has uid 0)"
    )


def test_waiting_for_gpus_elsewhere_says_which_nodes_lack_the_account() -> None:
    busy = node("b").gpus(1)
    p = _plan([node("a").gpus(4).lacks("alice"), busy],
              [job(1, unix_user="bob", gpus=1), job(2, unix_user="alice", gpus=1)])  # fmt: skip
    assert [pl.job_id for pl in p.placements] == [1]
    waiting = p.reasons()[2]
    assert waiting.kind is not ReasonKind.NO_ACCOUNT  # a node with the account exists
    assert waiting.message.endswith("(no usable Unix account 'alice' on a)")


def test_a_job_whose_owner_is_unknown_is_placed_anywhere() -> None:
    p = _plan([node("a").gpus(1).lacks("alice")], [job(1)])  # unix_user None
    assert [pl.node for pl in p.placements] == ["a"]
