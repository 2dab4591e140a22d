"""Off-peak window intervals along an advancing clock, generated a chunk at a time.

Window specs become concrete intervals with the calendar code
(`app.windows.calendar.occurrences`, zones and DST included). Calendar arithmetic is
dear (a minutely cron window is about 13,000 intervals over a cycle's nine-day view,
a second to generate), so intervals are generated once and extended as the clock
advances. Each cycle sees only the intervals around its `now`, so its cost does not
grow with the timeline's length. The trace simulator keeps one timeline for a whole
replay; the live scheduler one per window set (`SchedulerWindows`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from app.scheduling import WindowInterval
from app.windows.calendar import (
    SCHEDULER_LOOKAHEAD,
    SCHEDULER_LOOKBACK,
    WindowSpec,
    next_opening,
    occurrences,
)

_CHUNK = timedelta(days=7)


class WindowTimeline:
    """Intervals of `specs` (plus fixed `extra` ones) from `epoch` on, generated lazily."""

    def __init__(
        self,
        specs: Sequence[WindowSpec],
        *,
        epoch: datetime,
        extra: Iterable[WindowInterval] = (),
    ) -> None:
        self.specs = tuple(specs)  # read-only after construction
        self.epoch = epoch
        self._intervals: list[WindowInterval] = []
        self._seen: set[tuple[str, datetime, datetime]] = set()
        self._new_edges: list[datetime] = []
        self._longest = timedelta(0)
        self._horizon = epoch - SCHEDULER_LOOKBACK
        self._opens_again = True  # False once no spec opens within the calendar's lookahead
        self._add(extra)

    @property
    def empty(self) -> bool:
        return not self.specs and not self._intervals

    def _add(self, intervals: Iterable[WindowInterval]) -> None:
        added = False
        for iv in intervals:
            key = (iv.name, iv.opens_at, iv.closes_at)
            if key in self._seen:
                continue  # occurrences() repeats an interval that straddles a chunk edge
            self._seen.add(key)
            self._intervals.append(iv)
            self._new_edges += [iv.opens_at, iv.closes_at]
            self._longest = max(self._longest, iv.closes_at - iv.opens_at)
            added = True
        if added:
            self._intervals.sort(key=lambda w: (w.opens_at, w.name))

    def _forget(self, *, before: datetime) -> None:
        """Let go of intervals closed before `before`: no cycle will see them again (the
        clock only advances), and a long replay or a scheduler running for months would
        otherwise keep every interval it ever generated."""
        self._intervals = [w for w in self._intervals if w.closes_at > before]
        self._seen = {(w.name, w.opens_at, w.closes_at) for w in self._intervals}

    def _generate(self, until: datetime) -> None:
        if until <= self._horizon:
            return
        for spec in self.specs:
            self._add(
                WindowInterval(name=spec.name, opens_at=iv.opens_utc, closes_at=iv.closes_utc)
                for iv in occurrences(spec, start=self._horizon, end=until)
            )
        self._horizon = until

    def extend(self, now: datetime) -> list[datetime]:
        """Cover `now` + the cycle's lookahead, and the next opening after that.

        Returns the window edges (openings and closings) not returned before, so the
        caller can put them on its event queue: waiting off-peak jobs must be
        planned when a window opens and running ones stopped when it closes, even
        when no job arrives or ends then.
        """
        if self.specs and now + SCHEDULER_LOOKAHEAD > self._horizon:
            self._forget(before=now - SCHEDULER_LOOKBACK)
            # A chunk at a time: calendar arithmetic is far dearer than the events.
            self._generate(max(now + SCHEDULER_LOOKAHEAD, self._horizon + _CHUNK))
            # A sparse window (weekly, monthly) may not open within the lookahead;
            # without its opening on the queue, jobs waiting for it would stall.
            if self._opens_again and not (self._intervals and self._intervals[-1].opens_at > now):
                nxt = next_opening(self.specs, now)
                if nxt is None:
                    self._opens_again = False
                else:
                    self._generate(nxt.closes_utc + timedelta(seconds=1))
        edges, self._new_edges = self._new_edges, []
        return sorted(e for e in edges if e >= self.epoch)

    def around(self, now: datetime) -> tuple[WindowInterval, ...]:
        """The intervals a cycle at `now` is shown: open between 1 day ago and 8 days ahead."""
        lo, hi = now - SCHEDULER_LOOKBACK, now + SCHEDULER_LOOKAHEAD
        first = bisect.bisect_left(self._intervals, lo - self._longest, key=lambda w: w.opens_at)
        last = bisect.bisect_left(self._intervals, hi, key=lambda w: w.opens_at)
        return tuple(w for w in self._intervals[first:last] if w.closes_at > lo)


class SchedulerWindows:
    """The live scheduler's intervals across cycles: one timeline per window set, rebuilt
    when the set changes (or the clock steps back before the timeline's start)."""

    def __init__(self) -> None:
        self._timeline: WindowTimeline | None = None

    def around(self, specs: Sequence[WindowSpec], *, now: datetime) -> tuple[WindowInterval, ...]:
        """The intervals a cycle at `now` is shown (see `WindowTimeline.around`)."""
        timeline = self._timeline
        if timeline is None or timeline.specs != tuple(specs) or now < timeline.epoch:
            timeline = self._timeline = WindowTimeline(specs, epoch=now)
        timeline.extend(now)
        return timeline.around(now)
