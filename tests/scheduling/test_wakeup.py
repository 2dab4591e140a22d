"""next_wakeup: the soonest time a waiting job's clock-gated reason ends, from a real plan."""

from __future__ import annotations

import pytest

from app.scheduling import JobView, PendingReason, ReasonKind, plan_cycle
from app.scheduling.wakeup import next_wakeup
from tests.scheduling.builders import T0, at, job, node, running, snap, window


def _wakeup(*pending: JobView, windows=(), busy: bool = False):
    nodes = [node("n1").gpus(2)]
    # Busy: both GPUs taken, so "now" jobs wait for GPUs, a reason the clock does not end.
    running_jobs = [running(job(99, gpus=2), {"n1": (0, 1)})] if busy else []
    plan = plan_cycle(snap(nodes, pending, running_jobs, windows=windows), now=T0)
    return plan, next_wakeup(plan.pending, now=T0)


@pytest.mark.parametrize(
    ("pending", "windows", "expected"),
    [
        # The sooner of two begin times.
        (
            [
                job(1, schedule_mode="at", begin_at=at(90)),
                job(2, schedule_mode="at", begin_at=at(30)),
            ],
            (),
            at(30),
        ),
        # An off-peak job waits for the window's opening, sooner than the begin time.
        (
            [
                job(1, schedule_mode="at", begin_at=at(900)),
                job(2, schedule_mode="offpeak"),
            ],
            (window("night", 600, 3600),),
            at(600),
        ),
        # Begin time passed: the job is placed, nothing to wake for.
        ([job(1, schedule_mode="at", begin_at=at(-5))], (), None),
        # No clock-gated job at all.
        ([job(1)], (), None),
    ],
)
def test_soonest_clock_gated_reason(pending, windows, expected) -> None:
    _, wake = _wakeup(*pending, windows=windows)
    assert wake == expected


def test_waiting_for_gpus_is_not_clock_gated_even_with_an_estimated_start() -> None:
    # A job waiting behind a running one may have an estimated start (its time limit), but
    # the job's end triggers a cycle of its own: no timer for it.
    plan, wake = _wakeup(job(1, gpus=2), busy=True)
    assert plan.reasons()[1].kind is ReasonKind.WAITING_FOR_GPUS
    assert wake is None


def test_times_not_after_now_are_ignored() -> None:
    reasons = [
        PendingReason(1, ReasonKind.BEGIN_TIME, "", 1, T0),
        PendingReason(2, ReasonKind.WINDOW_CLOSED, "", 2, at(-1)),
        PendingReason(3, ReasonKind.WINDOW_CLOSED, "", 3, at(7)),
    ]
    assert next_wakeup(reasons, now=T0) == at(7)
