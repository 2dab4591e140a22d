"""The restart budget `gpusched up` keeps per process (its real processes are killed in
tests/e2e/test_up_supervision.py)."""

from __future__ import annotations

from app.processes import CrashBudget


def test_exits_within_the_window_count_and_older_ones_are_forgotten() -> None:
    budget = CrashBudget(burst=2, interval_s=60)
    assert budget.exited("scheduler", now=0) and budget.exited("scheduler", now=10)
    assert not budget.exited("scheduler", now=59)  # three within a minute
    assert budget.exits("scheduler") == 3
    # Each process has its own budget.
    assert budget.exited("the private Redis", now=59)


def test_a_process_that_crashes_now_and_then_lives_on() -> None:
    """The sixth scheduler crash in 14 minutes stopped the whole stack: with `up`'s
    defaults (5 within 10 minutes) it is restarted."""
    budget = CrashBudget(burst=5, interval_s=600)
    assert all(budget.exited("scheduler", now=t) for t in range(0, 841, 168))  # six
    assert budget.exits("scheduler") == 4  # those of the last ten minutes
    # Six in ten minutes is a loop: given up.
    assert not all(budget.exited("api", now=second) for second in range(0, 600, 100))
