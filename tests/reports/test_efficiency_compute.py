"""The pure efficiency computation: numbers worked out by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.accounting.efficiency import Held, JobFacts, Reading, compute, gpu_hours

T0 = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)


def facts(**overrides: object) -> JobFacts:
    values: dict[str, object] = {
        "job_id": 1,
        "name": "train",
        "project": "ml",
        "user": "alice",
        "status": "SUCCEEDED",
        "live": False,
        "gpus": 1,
        "gpu_memory_mb": None,
        "started_at": T0,
        "finished_at": T0 + timedelta(hours=1),
    }
    values.update(overrides)
    return JobFacts(**values)  # type: ignore[arg-type]


def held(index: int = 0, *, share: int = 1000, hours: float = 1.0, end: bool = True) -> Held:
    return Held(
        node="n1",
        gpu_index=index,
        model="H100-80GB",
        memory_total_mb=81559,
        share_milli=share,
        start=T0,
        end=T0 + timedelta(hours=hours) if end else None,
    )


def reading(
    seconds: float,
    *,
    index: int = 0,
    util: float | None = 50.0,
    memory: int | None = 1000,
    power: float | None = 100.0,
    resolution: int = 60,
) -> Reading:
    return Reading(
        at=T0 + timedelta(seconds=seconds),
        node="n1",
        gpu_index=index,
        util_pct=util,
        memory_used_mb=memory,
        power_w=power,
        resolution_s=resolution,
    )


def test_energy_is_the_trapezoid_of_power_skipping_gaps_over_five_minutes() -> None:
    # 0-60 s: (100+200)/2 * 60 = 9000 J; 60-120 s: (200+300)/2 * 60 = 15000 J;
    # 120-720 s: 600 s gap > 300 s, not integrated; 720-780 s: 300 * 60 = 18000 J.
    # Total 42000 J = 42000 / 3600 Wh.
    points = [
        reading(0, power=100),
        reading(60, power=200),
        reading(120, power=300),
        reading(720, power=300),
        reading(780, power=300),
    ]
    result = compute(facts(), [held()], points, now=T0 + timedelta(hours=2))
    assert result.energy_wh == pytest.approx(42000 / 3600)
    assert result.per_gpu[0].energy_wh == pytest.approx(42000 / 3600)


def test_energy_on_a_shared_gpu_is_scaled_by_the_share() -> None:
    points = [reading(0, power=100), reading(60, power=200), reading(120, power=300)]
    result = compute(facts(), [held(share=500)], points, now=T0 + timedelta(hours=2))
    assert result.energy_wh == pytest.approx(24000 / 3600 / 2)
    assert any("shared GPU" in note for note in result.notes)


def test_energy_sums_over_gpus_and_ignores_missing_power() -> None:
    points = [
        reading(0, index=0, power=100),
        reading(60, index=0, power=100),
        reading(0, index=1, power=200),
        reading(30, index=1, power=None),
        reading(60, index=1, power=200),
    ]
    result = compute(facts(gpus=2), [held(0), held(1)], points, now=T0 + timedelta(hours=2))
    # GPU0: 100 W * 60 s; GPU1: 200 W * 60 s (the None reading is skipped, not zero).
    assert result.energy_wh == pytest.approx((6000 + 12000) / 3600)


def test_gpu_hours_sum_held_time_times_share_and_run_to_now_while_held() -> None:
    now = T0 + timedelta(hours=3)
    allocations = [held(0, hours=2), held(1, share=250, hours=2), held(2, end=False)]
    # 2 h + 0.25 * 2 h + 3 h (still held at now)
    assert gpu_hours(allocations, now=now) == pytest.approx(5.5)
    # Clipped to a period starting one hour in: 1 + 0.25 + 2
    assert gpu_hours(allocations, now=now, since=T0 + timedelta(hours=1)) == pytest.approx(3.25)


def test_utilisation_is_weighted_by_sample_resolution() -> None:
    # 60 s at 90% (a roll-up) and two raw 5 s samples at 0%: (90*60) / 70.
    points = [
        reading(0, util=90, resolution=60),
        reading(60, util=0, resolution=5),
        reading(65, util=0, resolution=5),
    ]
    result = compute(facts(), [held()], points, now=T0 + timedelta(hours=2))
    assert result.avg_util_pct == pytest.approx(90 * 60 / 70)
    assert result.peak_util_pct == 90


def test_low_utilisation_flag() -> None:
    points = [reading(i * 60, util=5.0, memory=60_000) for i in range(10)]
    result = compute(facts(), [held()], points, now=T0 + timedelta(hours=2))
    assert [f.code for f in result.flags] == ["low_utilisation"]
    assert "data-loader workers" in result.flags[0].advice
    assert result.wasted_gpu_hours == pytest.approx(0.95)


def test_memory_underused_against_the_request() -> None:
    points = [reading(i * 60, util=90, memory=10_240) for i in range(10)]
    result = compute(facts(gpu_memory_mb=81_920), [held()], points, now=T0 + timedelta(hours=2))
    assert [f.code for f in result.flags] == ["memory_underused"]
    assert result.memory_basis == "requested"
    assert result.memory_used_pct == pytest.approx(12.5)
    assert "gpu_memory_mb=12288" in result.flags[0].advice
    assert "gpu_share=0.2" in result.flags[0].advice


def test_memory_without_a_request_is_judged_against_the_gpu() -> None:
    points = [reading(i * 60, util=90, memory=8_000) for i in range(10)]
    result = compute(facts(), [held()], points, now=T0 + timedelta(hours=2))
    assert result.memory_basis == "gpu_total"
    assert result.memory_requested_mb == 81559
    assert [f.code for f in result.flags] == ["memory_underused"]


def test_one_busy_gpu_of_four_flags_the_idle_ranks_only() -> None:
    points = [
        reading(i * 60, index=g, util=95.0 if g == 0 else 0.0, memory=60_000 if g == 0 else 500)
        for g in range(4)
        for i in range(10)
    ]
    allocations = [held(g) for g in range(4)]
    result = compute(facts(gpus=4), allocations, points, now=T0 + timedelta(hours=2))
    assert [f.code for f in result.flags] == ["idle_gpus"]
    assert result.idle_gpus == 3
    assert "only n1/gpu0 was busy" in result.flags[0].message
    assert "DistributedDataParallel" in result.flags[0].advice
    assert "CUDA_VISIBLE_DEVICES" in result.flags[0].advice
    assert result.avg_util_pct == pytest.approx(95 / 4)


def test_no_flags_from_too_little_or_no_telemetry() -> None:
    few = compute(facts(), [held()], [reading(0, util=1)], now=T0 + timedelta(hours=2))
    assert few.flags == [] and "too little" in few.notes[0]
    none = compute(facts(), [held()], [], now=T0 + timedelta(hours=2))
    assert none.flags == [] and none.avg_util_pct is None and none.wasted_gpu_hours == 0
    never = compute(facts(status="PENDING"), [], [], now=T0)
    assert never.gpu_hours == 0 and "no GPU" in never.notes[0]


def test_period_clips_readings_and_hours() -> None:
    points = [reading(i * 600, util=10 if i < 3 else 90) for i in range(6)]
    result = compute(
        facts(),
        [held()],
        points,
        now=T0 + timedelta(hours=2),
        since=T0 + timedelta(seconds=1800),
    )
    assert result.samples == 3
    assert result.avg_util_pct == pytest.approx(90)
    assert result.gpu_hours == pytest.approx(0.5)


def test_energy_is_priced_by_the_tariff_and_at_peak():
    from app.windows.tariff import Tariff

    # 10:00-11:00 UTC at a flat 400 W on one whole GPU = 400 Wh. The tariff charges 0.10
    # per kWh by default and 0.30 from 10:30 to 12:00 (UTC): half the energy at each price.
    tariff = Tariff.from_dict(
        {
            "timezone": "UTC",
            "default_price_per_kwh": 0.10,
            "rules": [{"start": "10:30", "end": "12:00", "price_per_kwh": 0.30}],
        }
    )
    readings = [reading(s, power=400.0) for s in range(0, 3601, 60)]
    result = compute(facts(), [held()], readings, now=T0 + timedelta(hours=2), tariff=tariff)
    assert result.energy_wh == pytest.approx(400.0)
    assert result.cost == pytest.approx(0.2 * 0.10 + 0.2 * 0.30)  # 0.08
    assert result.cost_at_peak == pytest.approx(0.4 * 0.30)  # 0.12
    untariffed = compute(facts(), [held()], readings, now=T0 + timedelta(hours=2))
    assert untariffed.cost is None and untariffed.cost_at_peak is None


def test_unusable_tariff_file_is_a_settings_error(tmp_path):
    from app.config import SettingsError, load_settings
    from app.windows.tariff import tariff_setting

    bad = tmp_path / "tariff.json"
    bad.write_text('{"timezone": "Nowhere/Land", "default_price_per_kwh": 0.1}')
    with pytest.raises(SettingsError, match="GPUSCHED_TARIFF_FILE"):
        tariff_setting(load_settings(tariff_file=bad))
