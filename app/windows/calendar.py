"""Off-peak windows: definitions and pure calendar arithmetic.

Nothing here touches a database, FastAPI or the clock: every moment (``now``,
``at``, ``after``) is a parameter and must be a timezone-aware datetime.

Two kinds of window exist:

* **daily** windows: wall-clock ranges such as ``01:00-05:00`` on some weekdays.
  An ``end`` before ``start`` crosses midnight; the ``days`` name the weekday on
  which the window *opens*.
* **cron** windows: a cron expression (5 fields, or an ``@daily``-style macro)
  giving the local wall-clock start times, plus ``duration_s`` real seconds.

Daylight-saving rules (apply to both kinds; all arithmetic is done in local wall
time and converted with :mod:`zoneinfo`):

* **Nonexistent local times** (spring forward, e.g. 02:30 on 2026-03-08 in
  America/New_York) resolve to the first valid instant after them, i.e. the
  transition itself (03:00 local). A window ``02:30-05:00`` therefore runs
  03:00-05:00 that day; two cron starts that both fall into the gap collapse
  into one.
* **Ambiguous local times** (fall back) use ``fold=0``, the *first*
  occurrence. A start at 01:30 happens once; a daily window ``00:00-04:00`` on
  fall-back night lasts 5 real hours (4 on spring-forward night). The same rule
  applies to window ends that land in the repeated hour.
* Cron start times are matched against the naive local wall clock (croniter on
  naive datetimes) and then resolved with the two rules above. This is
  deliberate: croniter iterating with a zone-aware start fires a ``0 1 * * *``
  expression twice on the America/New_York fall-back day. Consequence for
  hourly-style expressions: the repeated hour gets no second start.
* A cron window's ``duration_s`` is real elapsed seconds (computed in UTC), so
  its local end time may move by the DST offset.

Caveat for callers: Python compares and subtracts aware datetimes that share
the same ``tzinfo`` object by their *wall* time, ignoring ``fold``. Use
:meth:`Interval.duration_s`, :meth:`Interval.contains` or convert to UTC
before doing arithmetic on the returned datetimes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter
from pydantic import BaseModel, ConfigDict, field_serializer

Weekday = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
WEEKDAYS: tuple[Weekday, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
ALL_DAYS: frozenset[Weekday] = frozenset(WEEKDAYS)

#: matches ``app.jobs.schemas.ScheduleSpec.mode``
BeginMode = Literal["now", "offpeak", "at"]

SLUG_RE = re.compile(r"^[a-z0-9](?:[a-z0-9_-]{0,62}[a-z0-9])?$")
_HHMM_RE = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")

#: how far :func:`next_opening` looks ahead before giving up (cron windows can be
#: yearly; a never-matching expression is rejected at validation time).
MAX_LOOKAHEAD = timedelta(days=800)
_CHUNK = timedelta(days=14)
#: safety cap on occurrences produced by one call to :func:`occurrences`.
MAX_OCCURRENCES = 100_000


# --------------------------------------------------------------------------- validation


def validate_timezone(name: str) -> ZoneInfo:
    """Return the zone for an IANA name; ``ValueError`` if zoneinfo cannot load it."""
    if not isinstance(name, str) or not name or name != name.strip():
        raise ValueError(f"unknown time zone {name!r}")
    try:
        return _zone(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValueError(f"unknown time zone {name!r}") from exc


@lru_cache(maxsize=256)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def validate_cron(expr: str) -> str:
    """Check a cron expression with croniter; return it stripped.

    Accepted: standard 5-field expressions (minute granularity) and croniter's
    macros (``@hourly``, ``@daily``, ``@weekly``, ``@monthly``, ``@yearly``...).
    Rejected: seconds/year fields (6 or 7 fields), ``@reboot``, and expressions
    that never fire (e.g. ``0 0 30 2 *``).
    """
    if not isinstance(expr, str):
        raise ValueError("cron expression must be a string")
    text = " ".join(expr.split())
    if not text:
        raise ValueError("cron expression is empty")
    if not text.startswith("@") and len(text.split(" ")) != 5:
        raise ValueError(
            f"cron expression {expr!r} must have 5 fields (minute hour day month weekday)"
        )
    if not croniter.is_valid(text):
        raise ValueError(f"invalid cron expression {expr!r}")
    try:
        croniter(text, datetime(2000, 1, 1)).get_next(datetime)
    except (CroniterBadDateError, CroniterBadCronError, CroniterError) as exc:
        raise ValueError(f"cron expression {expr!r} never fires") from exc
    return text


def parse_hhmm(value: str) -> time:
    """Parse ``"HH:MM"`` (00:00-23:59) into a :class:`datetime.time`."""
    if isinstance(value, time):
        return value.replace(second=0, microsecond=0, tzinfo=None)
    m = _HHMM_RE.match(value) if isinstance(value, str) else None
    if m is None:
        raise ValueError(f"time must be HH:MM (00:00-23:59), got {value!r}")
    return time(int(m.group(1)), int(m.group(2)))


def parse_days(days: Iterable[str] | None) -> frozenset[Weekday]:
    """Normalise weekday names (``mon`` or ``monday``, any case); ``None`` = every day."""
    if days is None:
        return ALL_DAYS
    out: set[Weekday] = set()
    for d in days:
        key = d.strip().lower() if isinstance(d, str) else ""
        key = _FULL_DAY.get(key, key)
        if key not in WEEKDAYS:
            raise ValueError(f"unknown day {d!r}; use one of {', '.join(WEEKDAYS)}")
        out.add(WEEKDAYS[WEEKDAYS.index(key)])
    if not out:
        raise ValueError("days must not be empty (omit it for every day)")
    return frozenset(out)


_FULL_DAY = {
    "monday": "mon",
    "tuesday": "tue",
    "wednesday": "wed",
    "thursday": "thu",
    "friday": "fri",
    "saturday": "sat",
    "sunday": "sun",
}


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class DailyRange:
    """``start``-``end`` local wall time, opening on ``days``; end < start crosses midnight."""

    start: time
    end: time
    days: frozenset[Weekday] = ALL_DAYS

    def __post_init__(self) -> None:
        if self.start == self.end:
            raise ValueError("end must differ from start")
        if not self.days or not self.days <= ALL_DAYS:
            raise ValueError("days must be a non-empty subset of mon..sun")

    @property
    def crosses_midnight(self) -> bool:
        return self.end < self.start


@dataclass(frozen=True)
class WindowSpec:
    """A validated window definition (exactly one of ``cron`` / ``daily``)."""

    name: str
    timezone: str
    cron: str | None = None
    duration_s: int | None = None
    daily: tuple[DailyRange, ...] = ()
    capacity_outside_fraction: float = 0.0
    preempt_on_close: bool = True

    def __post_init__(self) -> None:
        if not SLUG_RE.match(self.name):
            raise ValueError(f"name {self.name!r} is not a slug")
        validate_timezone(self.timezone)
        if self.cron is not None and self.daily:
            raise ValueError("give either cron or daily, not both")
        if self.cron is None and not self.daily:
            raise ValueError("give either cron (with duration_s) or daily")
        if self.cron is not None:
            object.__setattr__(self, "cron", validate_cron(self.cron))
            if self.duration_s is None or self.duration_s <= 0:
                raise ValueError("duration_s must be > 0 for a cron window")
        elif self.duration_s is not None:
            raise ValueError("duration_s only applies to cron windows")
        if not 0.0 <= self.capacity_outside_fraction <= 1.0:
            raise ValueError("capacity_outside_fraction must be within 0..1")

    @property
    def zone(self) -> ZoneInfo:
        return _zone(self.timezone)


@dataclass(frozen=True, eq=False)
class Interval:
    """One concrete opening of a window: ``[opens_at, closes_at)`` in the window's zone.

    Equality and hashing use the UTC instants (plain datetime equality would
    ignore ``fold`` inside a repeated fall-back hour).
    """

    window: str
    opens_at: datetime
    closes_at: datetime
    timezone: str

    def _key(self) -> tuple[str, datetime, datetime]:
        return (self.window, self.opens_utc, self.closes_utc)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Interval):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    @property
    def opens_utc(self) -> datetime:
        return self.opens_at.astimezone(UTC)

    @property
    def closes_utc(self) -> datetime:
        return self.closes_at.astimezone(UTC)

    @property
    def duration_s(self) -> float:
        """Real elapsed seconds (DST-safe)."""
        return (self.closes_utc - self.opens_utc).total_seconds()

    def contains(self, at: datetime) -> bool:
        _require_aware(at, "at")
        u = at.astimezone(UTC)
        return self.opens_utc <= u < self.closes_utc

    def to_utc(self) -> Interval:
        """The same interval with UTC datetimes (safe for naive-style arithmetic)."""
        return Interval(self.window, self.opens_utc, self.closes_utc, self.timezone)

    def remaining_s(self, at: datetime) -> float:
        """Seconds from ``at`` until close (negative once closed)."""
        _require_aware(at, "at")
        return (self.closes_utc - at.astimezone(UTC)).total_seconds()


class UpcomingWindow(BaseModel):
    """One upcoming opening for the REST API; datetimes carry the zone's offset."""

    model_config = ConfigDict(frozen=True)

    window: str
    opens_at: datetime
    closes_at: datetime

    @field_serializer("opens_at", "closes_at")
    def _iso(self, value: datetime) -> str:
        # datetime.isoformat keeps "+00:00" (pydantic would write "Z").
        return value.isoformat()

    @classmethod
    def from_interval(cls, interval: Interval) -> UpcomingWindow:
        return cls(window=interval.window, opens_at=interval.opens_at, closes_at=interval.closes_at)


# --------------------------------------------------------------------------- wall-time helpers


# What a scheduling cycle is shown of the calendar around its `now` (the live cycle and the
# simulator alike): openings from a day back to 8 days ahead.
SCHEDULER_LOOKBACK = timedelta(days=1)
SCHEDULER_LOOKAHEAD = timedelta(days=8)


@dataclass(frozen=True, slots=True)
class WindowRules:
    """The window settings that apply to a whole cycle rather than one window."""

    # The strictest window's share of GPUs off-peak jobs may use outside every window;
    # None without windows (the policy's own setting stands).
    outside_fraction: float | None
    # Windows whose closing stops their preemptible off-peak jobs.
    preempt_on_close: frozenset[str]


def window_rules(specs: Sequence[WindowSpec]) -> WindowRules:
    return WindowRules(
        outside_fraction=min((s.capacity_outside_fraction for s in specs), default=None),
        preempt_on_close=frozenset(s.name for s in specs if s.preempt_on_close),
    )


def _require_aware(value: datetime, what: str) -> None:
    if not isinstance(value, datetime):
        raise TypeError(f"{what} must be a datetime")
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        raise ValueError(f"{what} must be timezone-aware")


def _round_trips(wall: datetime, zone: ZoneInfo, fold: int) -> bool:
    aware = wall.replace(tzinfo=zone, fold=fold)
    back = aware.astimezone(UTC).astimezone(zone).replace(tzinfo=None, fold=0)
    return back == wall.replace(fold=0)


def resolve_local(wall: datetime, zone: ZoneInfo) -> datetime:
    """Naive local wall time -> aware datetime in ``zone`` (DST rules in module doc).

    Ambiguous -> first occurrence (fold=0). Nonexistent -> the first valid
    instant after it (the moment of the transition).
    """
    wall = wall.replace(tzinfo=None, fold=0)
    if _round_trips(wall, zone, 0):
        return wall.replace(tzinfo=zone, fold=0)
    # In a gap: fold=1 maps to an instant before the transition, fold=0 after.
    lo = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    hi = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if lo > hi:  # defensive; zoneinfo puts fold=1 earlier inside a gap
        lo, hi = hi, lo
    after = hi.astimezone(zone).utcoffset()
    # Binary search (1 s resolution) for the first instant with the new offset.
    lo_s, hi_s = 0, int((hi - lo).total_seconds())
    while hi_s - lo_s > 1:
        mid = (lo_s + hi_s) // 2
        if (lo + timedelta(seconds=mid)).astimezone(zone).utcoffset() == after:
            hi_s = mid
        else:
            lo_s = mid
    return (lo + timedelta(seconds=hi_s)).astimezone(zone)


def _in_zone(at: datetime, zone: ZoneInfo) -> datetime:
    return at.astimezone(UTC).astimezone(zone)


def _sort_key(iv: Interval) -> tuple[datetime, str, datetime]:
    return (iv.opens_utc, iv.window, iv.closes_utc)


# --------------------------------------------------------------------------- occurrences


def occurrences(spec: WindowSpec, *, start: datetime, end: datetime) -> list[Interval]:
    """Concrete openings of ``spec`` overlapping ``[start, end)``, sorted by opening.

    Returned datetimes are aware, in the window's zone. An interval that opened
    before ``start`` but is still open is included (its real ``opens_at`` kept).
    """
    _require_aware(start, "start")
    _require_aware(end, "end")
    s_utc, e_utc = start.astimezone(UTC), end.astimezone(UTC)
    if e_utc <= s_utc:
        return []
    raw = _daily_raw(spec, s_utc, e_utc) if spec.daily else _cron_raw(spec, s_utc, e_utc)
    out = [iv for iv in raw if iv.closes_utc > s_utc and iv.opens_utc < e_utc]
    out.sort(key=_sort_key)
    return _dedupe(out)


def _dedupe(ivs: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    seen: set[tuple[datetime, datetime, str]] = set()
    for iv in ivs:
        key = (iv.opens_utc, iv.closes_utc, iv.window)
        if key not in seen:
            seen.add(key)
            out.append(iv)
    return out


def _daily_raw(spec: WindowSpec, s_utc: datetime, e_utc: datetime) -> list[Interval]:
    zone = spec.zone
    first = _in_zone(s_utc, zone).date() - timedelta(days=1)  # a range may cross midnight
    last = _in_zone(e_utc, zone).date()
    out: list[Interval] = []
    d: date = first
    while d <= last:
        wd = WEEKDAYS[d.weekday()]
        for rng in spec.daily:
            if wd not in rng.days:
                continue
            end_day = d + timedelta(days=1) if rng.crosses_midnight else d
            opens = resolve_local(datetime.combine(d, rng.start), zone)
            closes = resolve_local(datetime.combine(end_day, rng.end), zone)
            if closes.astimezone(UTC) <= opens.astimezone(UTC):
                continue  # e.g. 02:00-02:30 swallowed by a spring-forward gap
            out.append(Interval(spec.name, opens, closes, spec.timezone))
        d += timedelta(days=1)
    return out


def _cron_raw(spec: WindowSpec, s_utc: datetime, e_utc: datetime) -> list[Interval]:
    assert spec.cron is not None and spec.duration_s is not None
    zone = spec.zone
    dur = timedelta(seconds=spec.duration_s)
    # Start early enough to catch an opening still in progress at `start`, with
    # slack for DST offsets; walk naive wall time so croniter never sees a zone.
    begin_wall = _in_zone(s_utc - dur, zone).replace(tzinfo=None) - timedelta(hours=3)
    end_wall = _in_zone(e_utc, zone).replace(tzinfo=None) + timedelta(hours=3)
    it = croniter(spec.cron, begin_wall)
    out: list[Interval] = []
    for _ in range(MAX_OCCURRENCES):
        try:
            wall = it.get_next(datetime)
        except CroniterBadDateError:
            break
        if wall >= end_wall:
            break
        opens = resolve_local(wall, zone)
        closes = (opens.astimezone(UTC) + dur).astimezone(zone)
        out.append(Interval(spec.name, opens, closes, spec.timezone))
    return out


# --------------------------------------------------------------------------- queries


def open_intervals_at(specs: Sequence[WindowSpec], at: datetime) -> list[Interval]:
    """Every interval (any window) open at ``at``; latest-closing first."""
    _require_aware(at, "at")
    u = at.astimezone(UTC)
    hits: list[Interval] = []
    for spec in specs:
        look_back = timedelta(seconds=spec.duration_s or 0) + timedelta(days=2)
        for iv in occurrences(spec, start=u - look_back, end=u + timedelta(seconds=1)):
            if iv.contains(u):
                hits.append(iv)
    hits.sort(key=lambda iv: (-iv.closes_utc.timestamp(), iv.window, iv.opens_utc))
    return hits


def open_interval_at(specs: Sequence[WindowSpec], at: datetime) -> Interval | None:
    """The window open at ``at`` (if several, the one closing last), or ``None``."""
    hits = open_intervals_at(specs, at)
    return hits[0] if hits else None


def next_opening(specs: Sequence[WindowSpec], after: datetime) -> Interval | None:
    """The earliest interval with ``opens_at`` strictly after ``after``.

    Looks ahead at most :data:`MAX_LOOKAHEAD`; ``None`` if nothing opens by then.
    """
    _require_aware(after, "after")
    u = after.astimezone(UTC)
    lo = u
    horizon = u + MAX_LOOKAHEAD
    while lo < horizon:
        hi = min(lo + _CHUNK, horizon)
        found: list[Interval] = []
        for spec in specs:
            found.extend(iv for iv in occurrences(spec, start=lo, end=hi) if u < iv.opens_utc < hi)
        if found:
            return min(found, key=_sort_key)
        lo = hi
    return None


def upcoming(specs: Sequence[WindowSpec], *, now: datetime, days: float) -> list[UpcomingWindow]:
    """Openings overlapping ``[now, now + days)``, each window separately, by ``opens_at``.

    A window already open at ``now`` is included (its ``opens_at`` is in the past).
    """
    _require_aware(now, "now")
    if days <= 0:
        return []
    u = now.astimezone(UTC)
    ivs: list[Interval] = []
    for spec in specs:
        ivs.extend(occurrences(spec, start=u, end=u + timedelta(days=days)))
    ivs.sort(key=_sort_key)
    return [UpcomingWindow.from_interval(iv) for iv in ivs]


# --------------------------------------------------------------------------- job begin times


def schedule_ready(
    mode: BeginMode | str,
    begin_at: datetime | None,
    window_name: str | None,
    specs: Sequence[WindowSpec],
    now: datetime,
) -> tuple[bool, str, datetime | None]:
    """May a job start at ``now``? Returns ``(ready, reason_text, opens_at)``.

    * ``"now"``: ready, unless ``begin_at`` is given and still in the future.
    * ``"at"``: ready once ``now >= begin_at`` (``begin_at`` required); otherwise
      ``opens_at`` is ``begin_at``.
    * ``"offpeak"``: ready while the named window (or, if ``window_name`` is
      ``None``, any of ``specs``) is open and ``begin_at`` (optional) has passed.
      Otherwise ``opens_at`` is the next moment both hold (``None`` if the
      window never opens again within :data:`MAX_LOOKAHEAD`).

    ``reason_text`` is human-readable and suitable for a job's status line; it names no
    time (``opens_at`` is the time, for the client to format). An
    unknown ``window_name`` (e.g. deleted while the job waited) or an empty
    ``specs`` is reported as not ready with ``opens_at=None``, not raised.
    ``ValueError`` for an unknown mode or a missing ``begin_at`` in ``"at"`` mode.
    """
    _require_aware(now, "now")
    if begin_at is not None:
        _require_aware(begin_at, "begin_at")
    u = now.astimezone(UTC)
    not_before = begin_at.astimezone(UTC) if begin_at is not None else None

    if mode in ("now", "at"):
        if mode == "at" and begin_at is None:
            raise ValueError("begin_at is required when mode is 'at'")
        if not_before is None or u >= not_before:
            return True, "ready", None
        assert begin_at is not None
        return False, "waiting for begin time", begin_at

    if mode != "offpeak":
        raise ValueError(f"unknown begin mode {mode!r}; use now, offpeak or at")

    if window_name is not None and not any(s.name == window_name for s in specs):
        return False, f"window {window_name!r} does not exist", None
    if not specs:
        return False, "no off-peak windows are defined", None
    chosen = [s for s in specs if window_name is None or s.name == window_name]
    label = f"window {window_name!r}" if window_name else "an off-peak window"
    probe = max(u, not_before) if not_before is not None else u
    open_iv = open_interval_at(chosen, probe)
    if open_iv is not None and probe == u:
        return True, f"{label} open", None
    if open_iv is not None:
        # begin_at lies in the future, inside an open interval: start at begin_at.
        assert begin_at is not None
        return (
            False,
            f"waiting for begin time (inside {label})",
            _in_zone(begin_at, _zone(open_iv.timezone)),
        )
    nxt = next_opening(chosen, probe)
    if nxt is None:
        return False, f"{label} does not open again", None
    why = f"waiting for {label} to open"
    if begin_at is not None and probe > u:
        why += " (after its begin time)"
    return False, why, nxt.opens_at


def longest_opening_s(spec: WindowSpec, *, now: datetime) -> float:
    """Real seconds of `spec`'s longest single opening over the year from `now` (a daily
    range is an hour longer or shorter across a DST change); every opening of a cron
    window lasts `duration_s`. A non-preemptible job longer than this never fits."""
    if spec.cron is not None:
        assert spec.duration_s is not None
        return float(spec.duration_s)
    start = now.astimezone(UTC)
    openings = _daily_raw(spec, start, start + timedelta(days=366))
    return max((iv.duration_s for iv in openings), default=0.0)


def fits_in_window(
    interval: Interval | None,
    now: datetime,
    estimated_runtime_s: float | None,
    preemptible: bool,
) -> bool:
    """Can a job start at ``now`` inside ``interval``?

    * No interval, or ``now`` outside it: ``False``.
    * Preemptible jobs fit whenever the window is open (they are stopped at
      close if the window has ``preempt_on_close``).
    * Non-preemptible jobs must finish by ``closes_at``:
      ``now + estimated_runtime_s <= closes_at`` (real seconds). Pass the
      estimate, else the job's runtime limit. Unknown runtime (``None``) gets
      the benefit of the doubt and fits (as ``app.scheduling``'s off-peak
      filter does; the close is then enforced by ``max_runtime_s`` if any).
    """
    _require_aware(now, "now")
    if interval is None or not interval.contains(now):
        return False
    if preemptible:
        return True
    if estimated_runtime_s is None:
        return True
    return estimated_runtime_s <= interval.remaining_s(now)
