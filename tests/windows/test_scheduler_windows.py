"""The live scheduler's window intervals: the same as the calendar's for every cycle, but
generated once per window set instead of every cycle (a minutely cron window took about a
second per cycle, long enough to hold agents' reports back behind back-to-back cycles)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import app.windows.timeline as timeline_module
from app.scheduling import WindowInterval
from app.windows.calendar import (
    SCHEDULER_LOOKAHEAD,
    SCHEDULER_LOOKBACK,
    WindowSpec,
    occurrences,
)
from app.windows.schemas import WindowIn
from app.windows.timeline import SchedulerWindows

MINUTELY = WindowIn(name="minutely", timezone="UTC", cron="* * * * *", duration_s=15).to_spec()
NIGHTLY = WindowIn.model_validate(
    {"name": "nightly", "timezone": "Europe/Berlin", "daily": [{"start": "22:00", "end": "06:00"}]}
).to_spec()
T0 = datetime(2026, 3, 28, 23, 59, 30, tzinfo=UTC)  # Berlin springs forward that night


def _expected(specs: list[WindowSpec], now: datetime) -> tuple[WindowInterval, ...]:
    """Straight from the calendar: every opening overlapping the cycle's view."""
    lo, hi = now - SCHEDULER_LOOKBACK, now + SCHEDULER_LOOKAHEAD
    intervals = [
        WindowInterval(name=spec.name, opens_at=iv.opens_utc, closes_at=iv.closes_utc)
        for spec in specs
        for iv in occurrences(spec, start=lo, end=hi)
    ]
    return tuple(sorted(intervals, key=lambda w: (w.opens_at, w.name)))


@pytest.fixture
def generated(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many intervals the calendar generated for the timeline, call by call."""
    counts: list[int] = []

    def counting(spec: WindowSpec, *, start: datetime, end: datetime) -> list:  # type: ignore[type-arg]
        found = occurrences(spec, start=start, end=end)
        counts.append(len(found))
        return found

    monkeypatch.setattr(timeline_module, "occurrences", counting)
    return counts


def test_each_cycle_sees_the_calendars_intervals(generated: list[int]) -> None:
    windows = SchedulerWindows()
    specs = [MINUTELY, NIGHTLY]
    for step in (0, 1, 40, 3600, 6 * 86400, 9 * 86400):  # into a later chunk too
        now = T0 + timedelta(seconds=step)
        assert windows.around(specs, now=now) == _expected(specs, now)


def test_intervals_are_generated_a_chunk_at_a_time_not_every_cycle(
    generated: list[int],
) -> None:
    windows = SchedulerWindows()
    for second in range(600):  # ten minutes of cycles
        windows.around([MINUTELY], now=T0 + timedelta(seconds=second))
    # The cycle's nine-day view, then one week ahead on the next cycle; nothing after.
    assert generated == [9 * 1440, 7 * 1440]


def test_a_changed_window_set_rebuilds(generated: list[int]) -> None:
    windows = SchedulerWindows()
    windows.around([NIGHTLY], now=T0)
    calls = len(generated)
    later = T0 + timedelta(minutes=1)
    assert windows.around([NIGHTLY, MINUTELY], now=later) == _expected([NIGHTLY, MINUTELY], later)
    assert len(generated) > calls
    assert windows.around([], now=later) == ()


def test_a_long_running_timeline_lets_old_intervals_go() -> None:
    windows = SchedulerWindows()
    for day in range(60):
        now = T0 + timedelta(days=day, hours=7)
        assert windows.around([NIGHTLY], now=now) == _expected([NIGHTLY], now)
    held = windows._timeline._intervals  # type: ignore[union-attr]  # what it keeps in memory
    assert len(held) <= 1 + 8 + 7 + 1  # yesterday's, the view, one chunk ahead, one spare
