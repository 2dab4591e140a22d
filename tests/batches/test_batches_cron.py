"""Pure fire-time arithmetic: local wall-clock cron, DST-correct, each time once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

from app.batches.service import (
    fire_times,
    late_tolerance_s,
    latest_fire_at_or_before,
    next_fire_after,
)

NY = ZoneInfo("America/New_York")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_fall_back_day_fires_once_in_the_repeated_hour() -> None:
    times = fire_times("30 1 * * *", NY, start=utc(2026, 10, 30), end=utc(2026, 11, 3))
    assert [t.astimezone(UTC) for t in times] == [
        utc(2026, 10, 30, 5, 30),  # 01:30 EDT
        utc(2026, 10, 31, 5, 30),
        utc(2026, 11, 1, 5, 30),  # first 01:30 (EDT); the repeated 01:30 EST gets nothing
        utc(2026, 11, 2, 6, 30),  # 01:30 EST
    ]
    assert [t.isoformat() for t in times][2:] == [
        "2026-11-01T01:30:00-04:00",
        "2026-11-02T01:30:00-05:00",
    ]


def test_spring_forward_gap_fires_at_the_transition() -> None:
    times = fire_times("30 2 * * *", NY, start=utc(2026, 3, 7), end=utc(2026, 3, 10))
    assert [t.isoformat() for t in times] == [
        "2026-03-07T02:30:00-05:00",
        "2026-03-08T03:00:00-04:00",  # 02:30 does not exist that day
        "2026-03-09T02:30:00-04:00",
    ]


def test_several_matches_in_the_gap_collapse_into_one() -> None:
    times = fire_times("*/20 2 * * *", NY, start=utc(2026, 3, 8, 5), end=utc(2026, 3, 8, 9))
    assert [t.isoformat() for t in times] == ["2026-03-08T03:00:00-04:00"]


def test_latest_and_next_agree_with_the_listing() -> None:
    start, end = utc(2026, 10, 25), utc(2026, 11, 5)
    times = fire_times("0 */7 * * *", NY, start=start, end=end)
    for earlier, later in pairwise(times):
        assert next_fire_after("0 */7 * * *", NY, earlier) == later
        just_before = later - timedelta(seconds=1)
        assert latest_fire_at_or_before("0 */7 * * *", NY, just_before) == earlier
        assert latest_fire_at_or_before("0 */7 * * *", NY, later) == later


def test_latest_for_a_rare_cron_is_found_far_back() -> None:
    got = latest_fire_at_or_before("0 0 1 1 *", ZoneInfo("UTC"), utc(2026, 12, 31))
    assert got == utc(2026, 1, 1)


def test_tolerance_is_at_least_a_minute() -> None:
    assert late_tolerance_s(5) == 60
    assert late_tolerance_s(45) == 90


def test_daily_crons_fire_exactly_once_per_local_day_for_a_year_in_dst_zones() -> None:
    for name in ("America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "America/Santiago"):
        zone = ZoneInfo(name)
        for cron in ("30 1 * * *", "30 2 * * *", "0 0 * * *", "59 23 * * *"):
            times = fire_times(cron, zone, start=utc(2026, 1, 1), end=utc(2027, 1, 1))
            days = [t.date() for t in times]
            assert len(days) == len(set(days)), (name, cron)
            assert 364 <= len(days) <= 366, (name, cron, len(days))
            utcs = [t.astimezone(UTC) for t in times]
            assert utcs == sorted(utcs) and len(set(utcs)) == len(utcs)
