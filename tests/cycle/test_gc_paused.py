"""A cycle runs with the cyclic garbage collector paused, and leaves it as found."""

from __future__ import annotations

import gc

import pytest

from app.cycle.run import gc_paused, run_cycle
from app.cycle.snapshot import QueueMemory
from app.db import utcnow
from app.messaging import NullMessenger
from tests.cycle.jobs_api import SETTINGS
from tests.foundation.builders import insert_jobs, ready_node


def test_paused_inside_and_enabled_again_after() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_enabled_again_after_an_exception() -> None:
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("plan failed")
    assert gc.isenabled()


def test_a_caller_that_disabled_it_keeps_it_disabled() -> None:
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def _collections() -> int:
    return sum(generation["collections"] for generation in gc.get_stats())


def test_a_whole_cycle_runs_without_a_collection(api) -> None:
    """Snapshot, apply and ranks too, not only the plan: at 20,000 waiting the collector's
    passes over the views a scheduler keeps were 25-40 % of a full cycle's CPU."""
    with api.factory.begin() as session:
        session.add(ready_node("n1", gpus=2, now=utcnow()))
    waiting = 2_000
    insert_jobs(api.factory, user="alice", project="ml", count=waiting)
    before = _collections()
    report = run_cycle(factory=api.factory, messenger=NullMessenger(), settings=SETTINGS,
                       holder="t", now=utcnow(), memory=QueueMemory())  # fmt: skip
    # At most the one pass owed when the cycle enables the collector again (53 passes
    # when only the plan ran paused).
    assert _collections() - before <= 1
    assert report.ran and report.placed == 2 and report.pending == waiting - 2
    assert gc.isenabled()
