"""WindowIn / WindowOut validation: errors name the field in ``loc``."""

from __future__ import annotations

from datetime import time
from typing import Any

import pytest
from pydantic import ValidationError

from app.windows.calendar import DailyRange, WindowSpec
from app.windows.schemas import WindowIn, WindowOut

CRON: dict[str, Any] = {
    "name": "nightly",
    "timezone": "Europe/Berlin",
    "cron": "0 1 * * *",
    "duration_s": 14400,
}
DAILY: dict[str, Any] = {
    "name": "off-peak",
    "timezone": "America/New_York",
    "daily": [{"start": "22:00", "end": "06:00", "days": ["mon", "tue"]}],
}


def _locs(body: dict[str, Any]) -> list[tuple[int | str, ...]]:
    with pytest.raises(ValidationError) as exc:
        WindowIn.model_validate(body)
    return [e["loc"] for e in exc.value.errors()]


def test_valid_cron_body_to_spec() -> None:
    w = WindowIn.model_validate(CRON)
    spec = w.to_spec()
    assert spec == WindowSpec(
        name="nightly", timezone="Europe/Berlin", cron="0 1 * * *", duration_s=14400
    )
    assert spec.capacity_outside_fraction == 0.0
    assert spec.preempt_on_close is True


def test_valid_daily_body_to_spec() -> None:
    spec = WindowIn.model_validate(
        {**DAILY, "capacity_outside_fraction": 0.25, "preempt_on_close": False}
    ).to_spec()
    assert spec.daily == (DailyRange(time(22), time(6), frozenset({"mon", "tue"})),)
    assert spec.daily[0].crosses_midnight
    assert spec.capacity_outside_fraction == 0.25
    assert spec.preempt_on_close is False


def test_days_optional_means_every_day() -> None:
    spec = WindowIn.model_validate(
        {"name": "x", "timezone": "UTC", "daily": [{"start": "01:00", "end": "05:00"}]}
    ).to_spec()
    assert len(spec.daily[0].days) == 7


@pytest.mark.parametrize(
    "patch,loc",
    [
        ({"cron": "61 * * * *"}, ("cron",)),
        ({"cron": "not a cron"}, ("cron",)),
        ({"cron": "0 0 30 2 *"}, ("cron",)),  # never fires
        ({"cron": "0 0 1 * * *"}, ("cron",)),  # seconds field not accepted
        ({"timezone": "Mars/Olympus_Mons"}, ("timezone",)),
        ({"timezone": "../etc/passwd"}, ("timezone",)),
        ({"timezone": ""}, ("timezone",)),
        ({"duration_s": 0}, ("duration_s",)),
        ({"duration_s": -5}, ("duration_s",)),
        ({"duration_s": None}, ("duration_s",)),
        ({"name": "Not A Slug"}, ("name",)),
        ({"capacity_outside_fraction": 1.5}, ("capacity_outside_fraction",)),
        ({"capacity_outside_fraction": -0.1}, ("capacity_outside_fraction",)),
        ({"surprise": 1}, ("surprise",)),  # extra="forbid"
        ({"duration_s": True}, ("duration_s",)),  # not read as 1 s
        ({"capacity_outside_fraction": False}, ("capacity_outside_fraction",)),
    ],
)
def test_cron_body_errors_name_field(patch: dict[str, Any], loc: tuple[str, ...]) -> None:
    assert _locs({**CRON, **patch}) == [loc]


def test_both_cron_and_daily() -> None:
    assert _locs({**CRON, "daily": DAILY["daily"], "duration_s": 60}) == [("daily",)]


def test_neither_cron_nor_daily() -> None:
    assert _locs({"name": "x", "timezone": "UTC"}) == [("daily",)]


def test_duration_with_daily_rejected() -> None:
    assert _locs({**DAILY, "duration_s": 60}) == [("duration_s",)]


def test_invalid_cron_reports_only_cron() -> None:
    # the cross-field checks stay quiet when cron itself failed
    assert _locs({**CRON, "cron": "bad"}) == [("cron",)]


@pytest.mark.parametrize(
    "rng,loc",
    [
        ({"start": "01:00", "end": "01:00"}, ("daily", 0, "end")),
        ({"start": "25:00", "end": "01:00"}, ("daily", 0, "start")),
        ({"start": "1:00", "end": "02:00"}, ("daily", 0, "start")),
        ({"start": "01:00", "end": "02:60"}, ("daily", 0, "end")),
        ({"start": "01:00", "end": "02:00", "days": ["mon", "funday"]}, ("daily", 0, "days", 1)),
        ({"start": "01:00", "end": "02:00", "days": []}, ("daily", 0, "days")),
        ({"start": "01:00", "end": "02:00", "extra": 1}, ("daily", 0, "extra")),
    ],
)
def test_daily_range_errors_name_field(rng: dict[str, Any], loc: tuple[int | str, ...]) -> None:
    assert _locs({**DAILY, "daily": [rng]}) == [loc]


def test_empty_daily_list() -> None:
    assert _locs({**DAILY, "daily": []}) == [("daily",)]


def test_window_out_round_trip() -> None:
    spec = WindowIn.model_validate(DAILY).to_spec()
    out = WindowOut.from_spec(spec, id=7)
    data = out.model_dump()
    assert data["id"] == 7
    assert data["daily"] == [{"start": "22:00", "end": "06:00", "days": ["mon", "tue"]}]
    assert data["cron"] is None and data["duration_s"] is None
    assert WindowOut.model_validate(data).to_spec() == spec
    cron_out = WindowOut.from_spec(WindowIn.model_validate(CRON).to_spec(), id=1)
    assert cron_out.model_dump()["daily"] is None


def test_window_spec_validates_directly() -> None:
    with pytest.raises(ValueError, match="give either cron"):
        WindowSpec(name="x", timezone="UTC")
    with pytest.raises(ValueError, match="duration_s"):
        WindowSpec(name="x", timezone="UTC", cron="0 1 * * *", duration_s=0)
    with pytest.raises(ValueError, match="time zone"):
        WindowSpec(name="x", timezone="Nowhere/Land", cron="0 1 * * *", duration_s=1)
    with pytest.raises(ValueError, match="differ"):
        DailyRange(time(1), time(1))
