"""WakeUps: a timed cycle is sent for the soonest clock-gated time, once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from app.cycle.wakeup import HORIZON, WakeUps

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def s(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_arms_once_then_only_sooner_times_until_it_fires() -> None:
    w = WakeUps()
    assert w.arm(None, now=T0) is False
    assert w.arm(s(10), now=T0) is True
    assert w.arm(s(10), now=s(1)) is False  # each cycle sees it again: already armed
    assert w.arm(s(20), now=s(2)) is False  # later: armed once the first has fired
    assert w.arm(s(5), now=s(3)) is True  # sooner: armed too
    assert w.armed == s(5)
    # The cycle at s(5) has run: the next time is armed.
    assert w.arm(s(20), now=s(5)) is True


def test_times_beyond_the_horizon_wait_for_a_later_cycle() -> None:
    w = WakeUps()
    far = T0 + HORIZON + timedelta(seconds=1)
    assert w.arm(far, now=T0) is False
    assert w.armed is None
    assert w.arm(far, now=s(2)) is True
