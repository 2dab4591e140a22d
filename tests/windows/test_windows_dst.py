"""DST: wall-clock windows neither shift, double nor drop around transitions."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest

from app.windows.calendar import DailyRange, WindowSpec, occurrences, resolve_local

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")

# (zone name, spring-forward day, fall-back day)
TRANSITIONS = [
    ("Europe/Berlin", date(2026, 3, 29), date(2026, 10, 25)),
    ("America/New_York", date(2026, 3, 8), date(2026, 11, 1)),
]


def _cron(zone: str, expr: str = "0 1 * * *", duration_s: int = 4 * 3600) -> WindowSpec:
    return WindowSpec(name="cronwin", timezone=zone, cron=expr, duration_s=duration_s)


def _daily(zone: str, start: str, end: str) -> WindowSpec:
    h1, m1 = map(int, start.split(":"))
    h2, m2 = map(int, end.split(":"))
    return WindowSpec(
        name="dailywin", timezone=zone, daily=(DailyRange(time(h1, m1), time(h2, m2)),)
    )


def _week_around(zone: ZoneInfo, day: date) -> tuple[datetime, datetime]:
    start = datetime.combine(day - timedelta(days=3), time(0), tzinfo=zone)
    end = datetime.combine(day + timedelta(days=4), time(0), tzinfo=zone)
    return start, end


def _utc_offset_h(dt: datetime) -> float:
    off = dt.utcoffset()
    assert off is not None
    return off.total_seconds() / 3600


@pytest.mark.parametrize("zone_name,spring,fall", TRANSITIONS)
@pytest.mark.parametrize("which", ["spring", "fall"])
@pytest.mark.parametrize("kind", ["cron", "daily"])
def test_one_per_day_at_0100_local(
    zone_name: str, spring: date, fall: date, which: str, kind: str
) -> None:
    zone = ZoneInfo(zone_name)
    day = spring if which == "spring" else fall
    spec = _cron(zone_name) if kind == "cron" else _daily(zone_name, "01:00", "05:00")
    start, end = _week_around(zone, day)
    ivs = occurrences(spec, start=start, end=end)

    local_days = [iv.opens_at.astimezone(zone).date() for iv in ivs]
    expected_days = [day + timedelta(days=k) for k in range(-3, 4)]
    assert local_days == expected_days  # exactly one per day: no double, no drop
    for iv in ivs:
        local = iv.opens_at.astimezone(zone)
        assert (local.hour, local.minute) == (1, 0)  # no shift of the wall-clock start
        assert iv.opens_at.tzinfo is zone or str(iv.opens_at.tzinfo) == zone_name
        assert iv.window == spec.name
    # no two openings at the same instant
    assert len({iv.opens_utc for iv in ivs}) == len(ivs)


def test_croniter_aware_would_double_new_york_fall_back() -> None:
    """Documents why we iterate naive wall time: aware croniter fires 01:00 twice."""
    from croniter import croniter

    it = croniter("0 1 * * *", datetime(2026, 10, 31, 12, tzinfo=NEW_YORK))
    a, b = it.get_next(datetime), it.get_next(datetime)
    assert a.date() == b.date() == date(2026, 11, 1)  # the bug we avoid
    ivs = occurrences(
        _cron("America/New_York"),
        start=datetime(2026, 10, 31, 12, tzinfo=NEW_YORK),
        end=datetime(2026, 11, 2, 12, tzinfo=NEW_YORK),
    )
    assert [iv.opens_at.isoformat() for iv in ivs] == [
        "2026-11-01T01:00:00-04:00",
        "2026-11-02T01:00:00-05:00",
    ]


@pytest.mark.parametrize("zone_name,spring,fall", TRANSITIONS)
def test_cron_duration_is_real_seconds(zone_name: str, spring: date, fall: date) -> None:
    zone = ZoneInfo(zone_name)
    for day in (spring, fall):
        start, end = _week_around(zone, day)
        for iv in occurrences(_cron(zone_name), start=start, end=end):
            assert iv.duration_s == 4 * 3600
            assert iv.closes_utc - iv.opens_utc == timedelta(hours=4)


def test_cron_end_local_moves_on_new_york_fall_back() -> None:
    ivs = occurrences(
        _cron("America/New_York"),
        start=datetime(2026, 11, 1, tzinfo=NEW_YORK),
        end=datetime(2026, 11, 1, 12, tzinfo=NEW_YORK),
    )
    assert len(ivs) == 1
    assert ivs[0].opens_at.isoformat() == "2026-11-01T01:00:00-04:00"
    assert ivs[0].closes_at.isoformat() == "2026-11-01T04:00:00-05:00"


@pytest.mark.parametrize(
    "zone_name,day,hours",
    [
        ("America/New_York", date(2026, 11, 1), 5),
        ("America/New_York", date(2026, 3, 8), 3),
        ("America/New_York", date(2026, 6, 1), 4),
        ("Europe/Berlin", date(2026, 10, 25), 5),
        ("Europe/Berlin", date(2026, 3, 29), 3),
        ("Europe/Berlin", date(2026, 1, 5), 4),
    ],
)
def test_daily_0000_0400_real_length(zone_name: str, day: date, hours: int) -> None:
    zone = ZoneInfo(zone_name)
    spec = _daily(zone_name, "00:00", "04:00")
    ivs = occurrences(
        spec,
        start=datetime.combine(day, time(0), tzinfo=zone),
        end=datetime.combine(day, time(12), tzinfo=zone),
    )
    assert len(ivs) == 1
    iv = ivs[0]
    assert iv.opens_at.astimezone(zone).time() == time(0)
    assert iv.closes_at.astimezone(zone).time() == time(4)
    assert iv.duration_s == hours * 3600


def test_daily_start_in_spring_gap_starts_at_transition_new_york() -> None:
    spec = _daily("America/New_York", "02:30", "05:00")
    ivs = occurrences(
        spec,
        start=datetime(2026, 3, 7, tzinfo=NEW_YORK),
        end=datetime(2026, 3, 10, tzinfo=NEW_YORK),
    )
    assert [iv.opens_at.isoformat() for iv in ivs] == [
        "2026-03-07T02:30:00-05:00",
        "2026-03-08T03:00:00-04:00",  # 02:30 does not exist: first valid instant after
        "2026-03-09T02:30:00-04:00",
    ]
    assert ivs[1].duration_s == 2 * 3600


def test_daily_start_in_spring_gap_berlin() -> None:
    spec = _daily("Europe/Berlin", "02:30", "06:00")
    ivs = occurrences(
        spec,
        start=datetime(2026, 3, 29, tzinfo=BERLIN),
        end=datetime(2026, 3, 30, tzinfo=BERLIN),
    )
    assert [iv.opens_at.isoformat() for iv in ivs] == ["2026-03-29T03:00:00+02:00"]
    assert ivs[0].opens_utc == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)


def test_cron_start_in_spring_gap() -> None:
    spec = _cron("Europe/Berlin", "30 2 * * *", 3600)
    ivs = occurrences(
        spec,
        start=datetime(2026, 3, 28, tzinfo=BERLIN),
        end=datetime(2026, 3, 31, tzinfo=BERLIN),
    )
    assert [iv.opens_at.isoformat() for iv in ivs] == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
    ]


def test_cron_starts_collapsing_in_gap_are_deduplicated() -> None:
    spec = _cron("America/New_York", "0,30 2 * * *", 600)
    ivs = occurrences(
        spec,
        start=datetime(2026, 3, 8, tzinfo=NEW_YORK),
        end=datetime(2026, 3, 8, 12, tzinfo=NEW_YORK),
    )
    assert [iv.opens_at.isoformat() for iv in ivs] == ["2026-03-08T03:00:00-04:00"]


@pytest.mark.parametrize("kind", ["cron", "daily"])
def test_ambiguous_start_happens_once_first_occurrence(kind: str) -> None:
    spec = (
        _cron("America/New_York", "30 1 * * *", 3600)
        if kind == "cron"
        else _daily("America/New_York", "01:30", "03:00")
    )
    ivs = occurrences(
        spec,
        start=datetime(2026, 10, 31, 12, tzinfo=NEW_YORK),
        end=datetime(2026, 11, 1, 12, tzinfo=NEW_YORK),
    )
    assert len(ivs) == 1
    assert ivs[0].opens_at.isoformat() == "2026-11-01T01:30:00-04:00"  # fold=0, EDT
    assert ivs[0].opens_utc == datetime(2026, 11, 1, 5, 30, tzinfo=UTC)


def test_ambiguous_berlin_0230() -> None:
    ivs = occurrences(
        _daily("Europe/Berlin", "02:30", "04:00"),
        start=datetime(2026, 10, 25, tzinfo=BERLIN),
        end=datetime(2026, 10, 26, tzinfo=BERLIN),
    )
    assert len(ivs) == 1
    assert ivs[0].opens_at.isoformat() == "2026-10-25T02:30:00+02:00"
    assert ivs[0].duration_s == 2.5 * 3600  # 02:30 CEST -> 04:00 CET


def test_resolve_local_rules() -> None:
    assert resolve_local(datetime(2026, 3, 8, 2, 0), NEW_YORK).isoformat() == (
        "2026-03-08T03:00:00-04:00"
    )
    assert resolve_local(datetime(2026, 3, 8, 2, 59), NEW_YORK).isoformat() == (
        "2026-03-08T03:00:00-04:00"
    )
    amb = resolve_local(datetime(2026, 11, 1, 1, 15), NEW_YORK)
    assert _utc_offset_h(amb) == -4
    ok = resolve_local(datetime(2026, 7, 1, 12, 0), BERLIN)
    assert ok.isoformat() == "2026-07-01T12:00:00+02:00"


def test_hourly_cron_fall_back_no_second_run_of_repeated_hour() -> None:
    spec = _cron("America/New_York", "0 * * * *", 1800)
    ivs = occurrences(
        spec,
        start=datetime(2026, 11, 1, 0, 0, tzinfo=NEW_YORK),
        end=datetime(2026, 11, 1, 4, 0, tzinfo=NEW_YORK),  # 5 real hours
    )
    assert [iv.opens_at.isoformat() for iv in ivs] == [
        "2026-11-01T00:00:00-04:00",
        "2026-11-01T01:00:00-04:00",
        "2026-11-01T02:00:00-05:00",
        "2026-11-01T03:00:00-05:00",
    ]


def test_santiago_midnight_transition() -> None:
    santiago = ZoneInfo("America/Santiago")
    ivs = occurrences(
        _daily("America/Santiago", "00:00", "04:00"),
        start=datetime(2026, 9, 5, tzinfo=santiago),
        end=datetime(2026, 9, 8, tzinfo=santiago),
    )
    assert [(iv.opens_at.isoformat(), iv.duration_s) for iv in ivs] == [
        ("2026-09-05T00:00:00-04:00", 4 * 3600),
        ("2026-09-06T01:00:00-03:00", 3 * 3600),  # 00:00 does not exist that day
        ("2026-09-07T00:00:00-03:00", 4 * 3600),
    ]


def test_window_entirely_inside_spring_gap_is_skipped_that_day() -> None:
    """Documented: 02:00-02:30 on a day whose 02:00-02:30 does not exist has no opening."""
    lord_howe = ZoneInfo("Australia/Lord_Howe")  # 30-minute shift on 2026-10-04
    ivs = occurrences(
        _daily("Australia/Lord_Howe", "02:00", "02:30"),
        start=datetime(2026, 10, 3, tzinfo=lord_howe),
        end=datetime(2026, 10, 6, tzinfo=lord_howe),
    )
    assert [iv.opens_at.date() for iv in ivs] == [date(2026, 10, 3), date(2026, 10, 5)]
