"""Time-of-use tariff, energy integration and cost: all values hand-computed."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest

from app.windows.tariff import Tariff, TariffRule, cost_of_energy, energy_wh, price_at

BERLIN = ZoneInfo("Europe/Berlin")

# 2026-11-23 is a Monday.
TARIFF = Tariff.from_dict(
    {
        "timezone": "Europe/Berlin",
        "default_price_per_kwh": 0.30,
        "rules": [
            {
                "days": ["mon", "tue", "wed", "thu", "fri"],
                "start": "17:00",
                "end": "20:00",
                "price_per_kwh": 0.50,
            },
            {"start": "22:00", "end": "06:00", "price_per_kwh": 0.10},  # every day
        ],
    }
)
T0 = datetime(2026, 11, 23, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def berlin(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=BERLIN)


# --------------------------------------------------------------------------- energy


def test_energy_trapezoid() -> None:
    # (1000+2000)/2 W * 0.5 h + 2000 W * 0.5 h = 750 + 1000 = 1750 Wh
    samples = [(at(0), 1000.0), (at(1800), 2000.0), (at(3600), 2000.0)]
    assert energy_wh(samples, max_gap_s=3600) == pytest.approx(1750.0)


def test_energy_small_steps() -> None:
    # (100+200)/2 * 60 s + 200 * 60 s = 9000 + 12000 = 21000 J = 5.8333 Wh
    samples = [(at(0), 100.0), (at(60), 200.0), (at(120), 200.0)]
    assert energy_wh(samples, max_gap_s=300) == pytest.approx(21000 / 3600)


def test_energy_skips_long_gaps() -> None:
    # only 0..60 s integrated (100 W * 60 s = 6000 J); the 940 s gap is skipped
    samples = [(at(0), 100.0), (at(60), 100.0), (at(1000), 100.0)]
    assert energy_wh(samples, max_gap_s=300) == pytest.approx(6000 / 3600)
    # a gap of exactly max_gap_s is still integrated
    assert energy_wh([(at(0), 360.0), (at(300), 360.0)], max_gap_s=300) == pytest.approx(30.0)


def test_energy_unsorted_and_degenerate() -> None:
    samples = [(at(60), 200.0), (at(0), 100.0), (at(120), 200.0)]
    assert energy_wh(samples, max_gap_s=300) == pytest.approx(21000 / 3600)
    assert energy_wh([], max_gap_s=300) == 0.0
    assert energy_wh([(at(0), 5.0)], max_gap_s=300) == 0.0
    assert energy_wh([(at(0), 5.0), (at(0), 7.0)], max_gap_s=300) == 0.0


def test_energy_rejects_bad_samples() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        energy_wh([(datetime(2026, 1, 1), 1.0), (datetime(2026, 1, 1, 0, 1), 1.0)])
    with pytest.raises(ValueError, match="non-negative"):
        energy_wh([(at(0), -1.0), (at(1), 1.0)])
    with pytest.raises(ValueError, match="non-negative"):
        energy_wh([(at(0), float("nan")), (at(1), 1.0)])


def test_energy_samples_in_mixed_zones() -> None:
    # same instants, different zones: 1000 W for 1 h = 1000 Wh
    samples = [(berlin(2026, 11, 23, 1, 0), 1000.0), (at(3600), 1000.0)]
    assert energy_wh(samples, max_gap_s=3600) == pytest.approx(1000.0)


# --------------------------------------------------------------------------- prices


@pytest.mark.parametrize(
    "when,price",
    [
        (berlin(2026, 11, 23, 18, 0), 0.50),  # Monday peak
        (berlin(2026, 11, 23, 17, 0), 0.50),  # start inclusive
        (berlin(2026, 11, 23, 20, 0), 0.30),  # end exclusive
        (berlin(2026, 11, 28, 18, 0), 0.30),  # Saturday: no peak rule
        (berlin(2026, 11, 23, 23, 0), 0.10),  # night, crossing midnight
        (berlin(2026, 11, 24, 5, 59), 0.10),
        (berlin(2026, 11, 24, 6, 0), 0.30),
        (berlin(2026, 11, 24, 12, 0), 0.30),
        (datetime(2026, 11, 23, 17, 0, tzinfo=UTC), 0.50),  # 18:00 Berlin
    ],
)
def test_price_at(when: datetime, price: float) -> None:
    assert price_at(TARIFF, when) == price


def test_rule_days_name_the_start_day_and_first_match_wins() -> None:
    t = Tariff(
        timezone="Europe/Berlin",
        default_price_per_kwh=0.3,
        rules=(
            TariffRule(time(22), time(6), 0.05, frozenset({"fri"})),
            TariffRule(time(0), time(12), 0.20),
        ),
    )
    assert price_at(t, berlin(2026, 11, 28, 3, 0)) == 0.05  # Saturday morning, Friday rule
    assert price_at(t, berlin(2026, 11, 27, 3, 0)) == 0.20  # Friday morning: Thursday not listed
    assert price_at(t, berlin(2026, 11, 27, 23, 0)) == 0.05
    assert t.max_price_per_kwh == 0.3


def test_tariff_validation() -> None:
    with pytest.raises(ValueError, match="time zone"):
        Tariff(timezone="Nowhere/Land", default_price_per_kwh=0.1)
    with pytest.raises(ValueError, match="differ"):
        TariffRule(time(1), time(1), 0.1)
    with pytest.raises(ValueError, match="unknown day"):
        Tariff.from_dict(
            {
                "timezone": "UTC",
                "default_price_per_kwh": 0.1,
                "rules": [{"days": ["xyz"], "start": "01:00", "end": "02:00", "price_per_kwh": 1}],
            }
        )


# --------------------------------------------------------------------------- cost


def test_cost_split_at_price_boundary() -> None:
    # Monday 16:30-17:30 Berlin at 1000 W: 0.5 kWh @0.30 + 0.5 kWh @0.50 = 0.40
    samples = [(berlin(2026, 11, 23, 16, 30), 1000.0), (berlin(2026, 11, 23, 17, 30), 1000.0)]
    c = cost_of_energy(TARIFF, samples, max_gap_s=3600)
    assert c.energy_wh == pytest.approx(1000.0)
    assert c.cost == pytest.approx(0.40)
    assert c.cost_at_peak == pytest.approx(0.50)  # 1 kWh at max price 0.50
    assert c.skipped_s == 0


def test_cost_ramp_across_boundary() -> None:
    # 0 W -> 2000 W over 16:30-17:30; 1000 W at 17:00
    # before: (0+1000)/2 * 0.5 h = 250 Wh @0.30 = 0.075
    # after:  (1000+2000)/2 * 0.5 h = 750 Wh @0.50 = 0.375
    samples = [(berlin(2026, 11, 23, 16, 30), 0.0), (berlin(2026, 11, 23, 17, 30), 2000.0)]
    c = cost_of_energy(TARIFF, samples, max_gap_s=3600)
    assert c.energy_wh == pytest.approx(1000.0)
    assert c.cost == pytest.approx(0.45)
    assert c.cost_at_peak == pytest.approx(0.50)


def test_cost_many_samples_mixed_prices_and_gap() -> None:
    # 600 W sampled every 60 s from 19:50 to 20:10 Monday (20 min = 200 Wh):
    # 10 min @0.50 (100 Wh -> 0.05) + 10 min @0.30 (100 Wh -> 0.03) = 0.08,
    # then a 2 h gap (skipped) and one more minute at 22:10 (10 Wh @0.10 = 0.001)
    start = berlin(2026, 11, 23, 19, 50)
    samples = [(start + timedelta(minutes=m), 600.0) for m in range(21)]
    late = berlin(2026, 11, 23, 22, 10)
    samples += [(late, 600.0), (late + timedelta(minutes=1), 600.0)]
    c = cost_of_energy(TARIFF, samples, max_gap_s=300)
    assert c.energy_wh == pytest.approx(210.0)
    assert c.cost == pytest.approx(0.081)
    assert c.cost_at_peak == pytest.approx(0.105)
    assert c.skipped_s == pytest.approx(2 * 3600)


def test_cost_over_fall_back_night_counts_the_extra_hour() -> None:
    # 00:00 CEST -> 06:00 CET on 2026-10-25 is 7 real hours, all in the 0.10 night rule
    start = datetime(2026, 10, 24, 22, 0, tzinfo=UTC)
    samples = [(start + timedelta(hours=h), 1000.0) for h in range(8)]
    c = cost_of_energy(TARIFF, samples, max_gap_s=3600)
    assert c.energy_wh == pytest.approx(7000.0)
    assert c.cost == pytest.approx(0.70)
    assert c.cost_at_peak == pytest.approx(3.50)


def test_cost_no_rules_uses_default() -> None:
    flat = Tariff(timezone="UTC", default_price_per_kwh=0.2)
    c = cost_of_energy(flat, [(at(0), 2000.0), (at(1800), 2000.0)], max_gap_s=3600)
    assert (c.energy_wh, c.cost, c.cost_at_peak) == pytest.approx((1000.0, 0.2, 0.2))
