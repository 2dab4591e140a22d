"""Window occurrences, open/next queries, upcoming(), begin times (injected times only)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest

from app.windows.calendar import (
    DailyRange,
    Interval,
    WindowSpec,
    fits_in_window,
    next_opening,
    occurrences,
    open_interval_at,
    open_intervals_at,
    schedule_ready,
    upcoming,
    window_rules,
)

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")

# 2026-11-23 is a Monday.
NIGHT = WindowSpec(
    name="night",
    timezone="Europe/Berlin",
    daily=(DailyRange(time(22, 0), time(6, 0)),),
)
WEEKEND = WindowSpec(
    name="weekend",
    timezone="Europe/Berlin",
    daily=(DailyRange(time(8, 0), time(20, 0), frozenset({"sat", "sun"})),),
)
NY_CRON = WindowSpec(
    name="ny-batch", timezone="America/New_York", cron="0 1 * * mon-fri", duration_s=7200
)


def berlin(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=BERLIN)


def test_daily_crossing_midnight() -> None:
    ivs = occurrences(NIGHT, start=berlin(2026, 11, 23), end=berlin(2026, 11, 25))
    assert [(iv.opens_at.isoformat(), iv.closes_at.isoformat()) for iv in ivs] == [
        # opened Sunday 22:00, still open at Monday 00:00: included with its real start
        ("2026-11-22T22:00:00+01:00", "2026-11-23T06:00:00+01:00"),
        ("2026-11-23T22:00:00+01:00", "2026-11-24T06:00:00+01:00"),
        ("2026-11-24T22:00:00+01:00", "2026-11-25T06:00:00+01:00"),
    ]
    assert all(iv.duration_s == 8 * 3600 for iv in ivs)
    assert all(iv.window == "night" for iv in ivs)


def test_occurrences_end_is_exclusive_and_results_in_window_zone() -> None:
    ivs = occurrences(
        NIGHT,
        start=datetime(2026, 11, 23, 6, 0, tzinfo=BERLIN),  # first one closes exactly here
        end=datetime(2026, 11, 23, 21, 0, tzinfo=UTC),  # == 22:00 Berlin, exclusive
    )
    assert ivs == []
    ivs = occurrences(
        NIGHT,
        start=datetime(2026, 11, 23, 12, tzinfo=UTC),
        end=datetime(2026, 11, 23, 21, 1, tzinfo=UTC),
    )
    assert len(ivs) == 1
    assert ivs[0].opens_at.utcoffset() == timedelta(hours=1)


def test_days_of_week() -> None:
    ivs = occurrences(WEEKEND, start=berlin(2026, 11, 23), end=berlin(2026, 12, 7))
    assert [iv.opens_at.strftime("%a %d %H:%M") for iv in ivs] == [
        "Sat 28 08:00",
        "Sun 29 08:00",
        "Sat 05 08:00",
        "Sun 06 08:00",
    ]


def test_days_name_the_opening_day_for_midnight_crossing() -> None:
    fri_night = WindowSpec(
        name="fri-night",
        timezone="Europe/Berlin",
        daily=(DailyRange(time(23, 0), time(2, 0), frozenset({"fri"})),),
    )
    ivs = occurrences(fri_night, start=berlin(2026, 11, 23), end=berlin(2026, 11, 30))
    assert len(ivs) == 1
    assert ivs[0].opens_at.isoformat() == "2026-11-27T23:00:00+01:00"
    assert ivs[0].closes_at.isoformat() == "2026-11-28T02:00:00+01:00"


def test_several_daily_ranges() -> None:
    spec = WindowSpec(
        name="two",
        timezone="UTC",
        daily=(DailyRange(time(1, 0), time(2, 0)), DailyRange(time(13, 0), time(14, 0))),
    )
    ivs = occurrences(
        spec,
        start=datetime(2026, 1, 1, tzinfo=UTC),
        end=datetime(2026, 1, 2, tzinfo=UTC),
    )
    assert [iv.opens_at.hour for iv in ivs] == [1, 13]


def test_cron_occurrences_weekdays_only() -> None:
    ivs = occurrences(
        NY_CRON,
        start=datetime(2026, 11, 20, tzinfo=NEW_YORK),  # Friday
        end=datetime(2026, 11, 24, tzinfo=NEW_YORK),
    )
    assert [iv.opens_at.isoformat() for iv in ivs] == [
        "2026-11-20T01:00:00-05:00",
        "2026-11-23T01:00:00-05:00",
    ]


def test_cron_in_progress_at_start_is_included() -> None:
    ivs = occurrences(
        NY_CRON,
        start=datetime(2026, 11, 23, 2, 30, tzinfo=NEW_YORK),
        end=datetime(2026, 11, 23, 2, 31, tzinfo=NEW_YORK),
    )
    assert len(ivs) == 1
    assert ivs[0].closes_at.isoformat() == "2026-11-23T03:00:00-05:00"


def test_naive_datetimes_rejected() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        occurrences(NIGHT, start=datetime(2026, 1, 1), end=datetime(2026, 1, 2))
    with pytest.raises(ValueError, match="timezone-aware"):
        open_interval_at([NIGHT], datetime(2026, 1, 1))


def test_open_interval_at() -> None:
    iv = open_interval_at([NIGHT, WEEKEND], berlin(2026, 11, 24, 3, 0))
    assert iv is not None
    assert iv.window == "night"
    assert iv.closes_at.isoformat() == "2026-11-24T06:00:00+01:00"
    assert open_interval_at([NIGHT, WEEKEND], berlin(2026, 11, 24, 12, 0)) is None
    # boundaries: opens inclusive, closes exclusive
    assert open_interval_at([NIGHT], berlin(2026, 11, 24, 22, 0)) is not None
    assert open_interval_at([NIGHT], berlin(2026, 11, 24, 6, 0)) is None
    # any zone of `at` works
    assert open_interval_at([NIGHT], datetime(2026, 11, 24, 2, 0, tzinfo=UTC)) is not None


def test_open_interval_at_prefers_latest_close() -> None:
    # Saturday 23:00: night is open (until 06:00), weekend is not; Saturday 10:00 only weekend
    assert open_interval_at([NIGHT, WEEKEND], berlin(2026, 11, 28, 10)).window == "weekend"  # type: ignore[union-attr]
    long = WindowSpec(name="long", timezone="UTC", cron="0 21 * * *", duration_s=12 * 3600)
    hits = open_intervals_at([NIGHT, long], berlin(2026, 11, 24, 3, 0))
    assert [h.window for h in hits] == ["long", "night"]  # long closes 09:00 UTC+0 later
    assert open_interval_at([NIGHT, long], berlin(2026, 11, 24, 3, 0)).window == "long"  # type: ignore[union-attr]


def test_next_opening() -> None:
    nxt = next_opening([NIGHT, WEEKEND], berlin(2026, 11, 28, 6, 0))  # Saturday morning
    assert nxt is not None
    assert (nxt.window, nxt.opens_at.isoformat()) == ("weekend", "2026-11-28T08:00:00+01:00")
    # strictly after: at the exact opening moment the next one is tomorrow's
    nxt = next_opening([NIGHT], berlin(2026, 11, 23, 22, 0))
    assert nxt is not None
    assert nxt.opens_at.isoformat() == "2026-11-24T22:00:00+01:00"


def test_next_opening_far_ahead_yearly_cron() -> None:
    yearly = WindowSpec(name="newyear", timezone="UTC", cron="0 0 1 1 *", duration_s=3600)
    nxt = next_opening([yearly], datetime(2026, 1, 1, 0, 30, tzinfo=UTC))
    assert nxt is not None
    assert nxt.opens_at == datetime(2027, 1, 1, tzinfo=UTC)


def test_next_opening_none_without_specs() -> None:
    assert next_opening([], datetime(2026, 1, 1, tzinfo=UTC)) is None


def test_upcoming_sorted_each_window_separately_iso_offsets() -> None:
    now = datetime(2026, 11, 22, 23, 0, tzinfo=UTC)  # Monday 00:00 Berlin
    ups = upcoming([WEEKEND, NIGHT, NY_CRON], now=now, days=2)
    data = [json.loads(u.model_dump_json()) for u in ups]
    assert data == [
        # already open at `now` (opened Sunday 22:00 Berlin) is included
        {
            "window": "night",
            "opens_at": "2026-11-22T22:00:00+01:00",
            "closes_at": "2026-11-23T06:00:00+01:00",
        },
        {
            "window": "ny-batch",
            "opens_at": "2026-11-23T01:00:00-05:00",
            "closes_at": "2026-11-23T03:00:00-05:00",
        },
        {
            "window": "night",
            "opens_at": "2026-11-23T22:00:00+01:00",
            "closes_at": "2026-11-24T06:00:00+01:00",
        },
        {
            "window": "ny-batch",
            "opens_at": "2026-11-24T01:00:00-05:00",
            "closes_at": "2026-11-24T03:00:00-05:00",
        },
        {  # Tuesday 22:00 Berlin is before now + 2 days (Wednesday 00:00 Berlin)
            "window": "night",
            "opens_at": "2026-11-24T22:00:00+01:00",
            "closes_at": "2026-11-25T06:00:00+01:00",
        },
    ]
    assert upcoming([NIGHT], now=now, days=0) == []


def test_upcoming_utc_zone_keeps_numeric_offset() -> None:
    spec = WindowSpec(
        name="london", timezone="Europe/London", daily=(DailyRange(time(1), time(5)),)
    )
    ups = upcoming([spec], now=datetime(2026, 11, 22, 12, tzinfo=UTC), days=1)
    assert ups[0].model_dump(mode="json")["opens_at"] == "2026-11-23T01:00:00+00:00"


# --------------------------------------------------------------------------- begin times


def test_schedule_ready_now() -> None:
    now = berlin(2026, 11, 23, 12)
    assert schedule_ready("now", None, None, [], now) == (True, "ready", None)


def test_schedule_ready_at() -> None:
    now = berlin(2026, 11, 23, 12)
    begin = berlin(2026, 11, 23, 18)
    ready, why, when = schedule_ready("at", begin, None, [], now)
    assert (ready, when) == (False, begin)
    # The time is `when`, for the caller to format: the text names none.
    assert why == "waiting for begin time"
    assert schedule_ready("at", begin, None, [], begin)[0] is True
    assert schedule_ready("at", begin, None, [], begin + timedelta(seconds=1))[0] is True
    with pytest.raises(ValueError, match="begin_at"):
        schedule_ready("at", None, None, [], now)


def test_schedule_ready_window() -> None:
    specs = [NIGHT, WEEKEND]
    ready, why, when = schedule_ready("offpeak", None, "night", specs, berlin(2026, 11, 23, 12))
    assert not ready
    assert when is not None and when.isoformat() == "2026-11-23T22:00:00+01:00"
    assert "night" in why
    ready, why, when = schedule_ready("offpeak", None, "night", specs, berlin(2026, 11, 23, 23))
    assert ready and when is None
    assert why == "window 'night' open"
    # any window when no name: Saturday noon -> weekend is open
    assert schedule_ready("offpeak", None, None, specs, berlin(2026, 11, 28, 12))[0] is True


def test_schedule_ready_window_and_begin_at() -> None:
    specs = [NIGHT]
    now = berlin(2026, 11, 23, 23)  # night open now, but begin_at is later
    begin = berlin(2026, 11, 24, 2)  # still inside the same night
    ready, _, when = schedule_ready("offpeak", begin, "night", specs, now)
    assert not ready and when == begin
    begin = berlin(2026, 11, 24, 12)  # outside: wait for the opening after begin_at
    ready, why, when = schedule_ready("offpeak", begin, "night", specs, now)
    assert not ready
    assert when is not None and when.isoformat() == "2026-11-24T22:00:00+01:00"
    assert why == "waiting for window 'night' to open (after its begin time)"
    assert schedule_ready("offpeak", begin, "night", specs, berlin(2026, 11, 24, 22, 30))[0]


def test_schedule_ready_errors() -> None:
    now = berlin(2026, 11, 23, 12)
    assert schedule_ready("offpeak", None, "nope", [NIGHT], now) == (
        False,
        "window 'nope' does not exist",
        None,
    )
    assert schedule_ready("offpeak", None, None, [], now)[0:3:2] == (False, None)
    with pytest.raises(ValueError, match="unknown begin mode"):
        schedule_ready("sometime", None, None, [NIGHT], now)


def test_fits_in_window() -> None:
    iv = Interval("night", berlin(2026, 11, 23, 22), berlin(2026, 11, 24, 6), "Europe/Berlin")
    now = berlin(2026, 11, 24, 4)  # 2 h left
    assert fits_in_window(iv, now, 7200, preemptible=False)
    assert not fits_in_window(iv, now, 7201, preemptible=False)
    assert fits_in_window(iv, now, 99999, preemptible=True)
    assert fits_in_window(iv, now, None, preemptible=False)  # benefit of the doubt
    assert fits_in_window(iv, now, None, preemptible=True)
    assert not fits_in_window(iv, berlin(2026, 11, 24, 7), 60, preemptible=True)
    assert not fits_in_window(iv, berlin(2026, 11, 24, 7), None, preemptible=False)
    utc = iv.to_utc()
    assert utc == iv and utc.opens_at.tzinfo is UTC
    assert not fits_in_window(None, now, 60, preemptible=True)


def test_fits_in_window_counts_real_seconds_over_fall_back() -> None:
    spec = WindowSpec(name="ny", timezone="America/New_York", daily=(DailyRange(time(0), time(4)),))
    iv = open_interval_at([spec], datetime(2026, 11, 1, 0, 30, tzinfo=NEW_YORK))
    assert iv is not None and iv.duration_s == 5 * 3600
    now = datetime(2026, 11, 1, 4, 30, tzinfo=UTC)  # 00:30 EDT; 4.5 real hours left
    assert fits_in_window(iv, now, 4.5 * 3600, preemptible=False)
    assert not fits_in_window(iv, now, 4.5 * 3600 + 1, preemptible=False)


def test_interval_equality_uses_instants() -> None:
    ny = ZoneInfo("America/New_York")
    first = datetime(2026, 11, 1, 1, 30, tzinfo=ny, fold=0)
    second = datetime(2026, 11, 1, 1, 30, tzinfo=ny, fold=1)
    a = Interval("w", first, first + timedelta(hours=3), "America/New_York")
    b = Interval("w", second, second + timedelta(hours=3), "America/New_York")
    assert a != b
    assert len({a, b}) == 2


def test_window_rules_take_the_strictest_fraction_and_the_preempting_windows() -> None:
    loose = replace(NIGHT, capacity_outside_fraction=0.5)
    strict = replace(WEEKEND, capacity_outside_fraction=0.25, preempt_on_close=False)
    rules = window_rules([loose, strict])
    assert rules.outside_fraction == 0.25
    assert rules.preempt_on_close == frozenset({"night"})
    assert window_rules([]).outside_fraction is None
