"""The plan phase runs with the cyclic garbage collector paused, and leaves it as found."""

from __future__ import annotations

import gc

import pytest

from app.cycle.run import gc_paused


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
