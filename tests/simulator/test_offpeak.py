"""Off-peak windows, window-close preemption and energy cost in the simulator.

Tiny traces with hand-computed results. The simulated epoch is
2026-01-01 00:00 UTC (a Thursday) unless a test says otherwise; times below
are seconds after it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from app.cli import app
from app.simulator import TraceJob, read_trace, simulate
from app.simulator.energy import GpuRun, energy_use
from app.simulator.engine import SIM_EPOCH
from app.simulator.trace import mark_offpeak, mark_preemptible
from app.windows.calendar import WindowSpec, occurrences
from app.windows.schemas import WindowIn
from app.windows.tariff import Tariff

H = 3600.0
DAY = 24 * H


def job(
    i: int, gpus: int, submit: float, duration: float, *, offpeak: bool = False, milli: int = 1000
) -> TraceJob:
    return TraceJob(f"j{i}", "u", "v", f"n{i}", gpus, milli, submit, duration, offpeak)


def window(**body: Any) -> WindowSpec:
    """Built through the API's schema, as the CLI's windows file is."""
    return WindowIn.model_validate({"name": "night", "timezone": "UTC", **body}).to_spec()


NIGHT = window(daily=[{"start": "02:00", "end": "04:00"}])  # 7200..14400 each day
TARIFF = Tariff.from_dict(
    {
        "timezone": "UTC",
        "default_price_per_kwh": 0.30,
        "rules": [{"start": "00:00", "end": "06:00", "price_per_kwh": 0.10}],
    }
)


def runs_of(result: Any, job_id: str) -> list[tuple[float, float]]:
    return [(r.start_s, r.end_s) for r in result.runs if r.job_id == job_id]


# --------------------------------------------------------------------------- waiting for windows


def test_offpeak_job_waits_for_the_window_while_peak_work_runs() -> None:
    # 2 GPUs. Peak j0 starts at once (JCT 100); off-peak j1 waits for 02:00 and runs
    # 7200..7800 although a GPU is free all night: JCT 7800.
    trace = [job(0, 1, 0, 100), job(1, 1, 0, 600, offpeak=True)]
    r = simulate(trace, nodes=1, gpus_per_node=2, policy="default", window_specs=[NIGHT])
    assert r.jcts == [100, 7800]
    assert runs_of(r, "j1") == [(7200, 7800)]
    assert r.offpeak_jobs == 1 and r.preemptions == 0


def test_peak_jobs_do_not_wait_for_a_window() -> None:
    trace = [job(0, 1, 0, 100), job(1, 1, 0, 600)]
    r = simulate(trace, nodes=1, gpus_per_node=2, policy="default", window_specs=[NIGHT])
    assert r.jcts == [100, 600]


def test_offpeak_job_arriving_inside_an_open_window_starts_at_once() -> None:
    r = simulate(
        [job(0, 1, 8000, 600, offpeak=True)],
        nodes=1,
        gpus_per_node=1,
        policy="fifo",
        window_specs=[NIGHT],
    )
    assert runs_of(r, "j0") == [(8000, 8600)]


@pytest.mark.parametrize(
    ("fraction", "jcts"), [(0.0, [7800, 7800]), (0.5, [600, 1200]), (1.0, [600, 600])]
)
def test_capacity_outside_fraction_lets_some_offpeak_work_run_outside(
    fraction: float, jcts: list[float]
) -> None:
    # 2 GPUs, two 1-GPU off-peak jobs at 00:00. With 0.5 one GPU's worth of off-peak
    # work may run outside the window (the live cycle's rule, from the strictest window):
    # one job runs 0..600, the other after it, 600..1200. With 0 both wait for 02:00.
    spec = window(daily=[{"start": "02:00", "end": "04:00"}], capacity_outside_fraction=fraction)
    trace = [job(0, 1, 0, 600, offpeak=True), job(1, 1, 0, 600, offpeak=True)]
    r = simulate(trace, nodes=1, gpus_per_node=2, policy="fifo", window_specs=[spec])
    assert r.jcts == jcts


def test_window_zone_and_daylight_saving_apply() -> None:
    # 03:00-04:00 New York. Epoch 2026-03-08 00:00 UTC is 19:00 EST on the 7th; the
    # clocks spring forward that night, so the window opens at 07:00 UTC (EDT), not 08:00.
    spec = window(timezone="America/New_York", daily=[{"start": "03:00", "end": "04:00"}])
    epoch = datetime(2026, 3, 8, tzinfo=UTC)
    r = simulate(
        [job(0, 1, 0, 60, offpeak=True)],
        nodes=1,
        gpus_per_node=1,
        policy="fifo",
        window_specs=[spec],
        epoch=epoch,
    )
    assert runs_of(r, "j0") == [(7 * H, 7 * H + 60)]


def test_weekly_window_far_ahead_still_opens() -> None:
    # Opens only on Wednesdays (2026-01-07 is the first, 6 days after the epoch). j1
    # arrives on Friday 9th with nothing else happening until the next Wednesday: the
    # opening must be on the event queue already or j1 would stall.
    spec = window(daily=[{"start": "01:00", "end": "02:00", "days": ["wed"]}])
    r = simulate(
        [job(0, 1, 0, 60, offpeak=True), job(1, 1, 8 * DAY, 60, offpeak=True)],
        nodes=1,
        gpus_per_node=1,
        policy="fifo",
        window_specs=[spec],
    )
    assert runs_of(r, "j0") == [(6 * DAY + H, 6 * DAY + H + 60)]
    assert runs_of(r, "j1") == [(13 * DAY + H, 13 * DAY + H + 60)]


def test_offpeak_jobs_without_windows_are_rejected() -> None:
    with pytest.raises(ValueError, match="need at least one window"):
        simulate([job(0, 1, 0, 60, offpeak=True)], nodes=1, gpus_per_node=1, policy="fifo")


# --------------------------------------------------------------------------- window close


@pytest.mark.parametrize("cost", [0, 300])
def test_offpeak_job_running_at_close_is_requeued_and_finishes_next_window(cost: int) -> None:
    # 1 GPU. Off-peak j0 (3 h) runs 02:00-04:00, is stopped at the close with 1 h left,
    # and finishes in the next night's window: 93600..97200, plus the preemption's cost
    # (a window's close is charged as any preemption). Peak j1 (arrives 14000) gets the
    # freed GPU at the close itself (14400..15400), not at the next event.
    trace = [job(0, 1, 0, 3 * H, offpeak=True), job(1, 1, 14000, 1000)]
    r = simulate(
        trace,
        nodes=1,
        gpus_per_node=1,
        policy="fifo",
        window_specs=[NIGHT],
        preemption_cost_s=cost,
    )
    assert runs_of(r, "j0") == [(7200, 14400), (DAY + 7200, DAY + 10800 + cost)]
    assert runs_of(r, "j1") == [(14400, 15400)]
    assert r.jcts == [DAY + 10800 + cost, 1400]
    assert r.preemptions == 1 and r.window_preemptions == 1
    assert r.preemption_lost_gpu_h == pytest.approx(cost / H)


def test_a_job_drawn_not_preemptible_runs_on_past_the_close() -> None:
    trace = mark_preemptible([job(0, 1, 0, 3 * H, offpeak=True)], fraction=0, seed=0)
    r = simulate(trace, nodes=1, gpus_per_node=1, policy="fifo", window_specs=[NIGHT])
    assert runs_of(r, "j0") == [(7200, 7200 + 3 * H)]
    assert r.preemptions == 0 and r.preemptible_jobs == 0


def test_window_without_preempt_on_close_lets_the_job_run_on() -> None:
    spec = window(daily=[{"start": "02:00", "end": "04:00"}], preempt_on_close=False)
    r = simulate(
        [job(0, 1, 0, 3 * H, offpeak=True)],
        nodes=1,
        gpus_per_node=1,
        policy="fifo",
        window_specs=[spec],
    )
    assert runs_of(r, "j0") == [(7200, 7200 + 3 * H)]
    assert r.preemptions == 0


def test_cron_window_closes_after_its_duration() -> None:
    # Every day at 02:00 for 1 h: a 90-minute job runs 1 h, then 30 min the next night,
    # plus 5 min (the default preemption cost) to restart from its checkpoint.
    spec = window(cron="0 2 * * *", duration_s=3600)
    r = simulate(
        [job(0, 1, 0, 5400, offpeak=True)],
        nodes=1,
        gpus_per_node=1,
        policy="fifo",
        window_specs=[spec],
    )
    assert runs_of(r, "j0") == [(7200, 10800), (DAY + 7200, DAY + 9300)]


def test_offpeak_runs_stay_inside_windows_on_a_real_trace() -> None:
    path = Path(__file__).resolve().parents[3] / "shared" / "traces" / "philly_ed69ec.csv"
    if not path.exists():
        pytest.skip("shared traces not present")
    trace = mark_offpeak(read_trace(path)[:120], fraction=0.5, seed=3)
    spec = window(timezone="Europe/Berlin", daily=[{"start": "22:00", "end": "06:00"}])
    r = simulate(trace, nodes=2, gpus_per_node=8, policy="default", window_specs=[spec])
    assert r.jobs == 120 and r.offpeak_jobs == 60
    offpeak = {j.job_id for j in trace if j.offpeak}
    end = SIM_EPOCH + timedelta(seconds=max(run.end_s for run in r.runs) + DAY)
    nights = occurrences(spec, start=SIM_EPOCH - timedelta(days=1), end=end)
    for run in r.runs:
        if run.job_id not in offpeak:
            continue
        start = SIM_EPOCH + timedelta(seconds=run.start_s)
        stop = SIM_EPOCH + timedelta(seconds=run.end_s)
        inside = [iv for iv in nights if iv.contains(start)]
        assert inside, f"{run.job_id} started outside a window at {start}"
        assert stop <= inside[0].closes_utc  # stopped at the close at the latest
    assert r.window_preemptions > 0  # long jobs did meet a closing window


# --------------------------------------------------------------------------- energy and cost


def test_energy_and_cost_by_hand() -> None:
    # 2 GPUs, 500 W each, tariff 0.10 from 00:00 to 06:00 UTC, else 0.30.
    # j0: 2 GPUs 05:00-07:00 -> 2 x 500 W x 2 h = 2 kWh: 1 kWh at 0.10 + 1 kWh at 0.30 = 0.40
    # j1: half a GPU 10:00-11:00 -> 0.5 x 500 W x 1 h = 0.25 kWh at 0.30 = 0.075
    # energy 2.25 kWh, cost 0.475, at peak 2.25 x 0.30 = 0.675
    trace = [job(0, 2, 5 * H, 2 * H), job(1, 1, 10 * H, H, milli=500)]
    r = simulate(trace, nodes=1, gpus_per_node=2, policy="fifo", tariff=TARIFF, gpu_watts=500)
    assert r.energy_wh == pytest.approx(2250)
    assert r.cost == pytest.approx(0.475)
    assert r.cost_at_peak == pytest.approx(0.675)
    assert r.to_json()["cost"] == pytest.approx(0.475)


def test_energy_counts_only_the_time_gpus_ran() -> None:
    # The 3-hour off-peak job above runs 02:00-04:00 and 02:00-03:05 the next day (its
    # last hour and 5 minutes to restart, the default preemption cost): 3 h 5 min x 700 W
    # = 2,158.3 Wh, all at the night price 0.10 = 0.2158 (0.6475 at peak).
    r = simulate(
        [job(0, 1, 0, 3 * H, offpeak=True)],
        nodes=1,
        gpus_per_node=1,
        policy="fifo",
        window_specs=[NIGHT],
        tariff=TARIFF,
    )
    assert r.energy_wh == pytest.approx(700 * (3 + 5 / 60))
    assert r.cost == pytest.approx(0.07 * (3 + 5 / 60))
    assert r.cost_at_peak == pytest.approx(0.21 * (3 + 5 / 60))


def test_no_tariff_gives_energy_but_no_cost() -> None:
    r = simulate([job(0, 4, 0, 1800)], nodes=1, gpus_per_node=4, policy="fifo", gpu_watts=250)
    assert r.energy_wh == pytest.approx(500)  # 4 x 250 W x 0.5 h
    assert r.cost is None and r.cost_at_peak is None


def test_energy_use_splits_a_run_at_price_changes() -> None:
    # 1 GPU-equivalent at 1000 W from 23:00 to 07:00 across two nights: 8 kWh; the hours
    # 23-24 and 06-07 at 0.30, 00-06 at 0.10 -> 0.3 + 0.6 + 0.3 = 1.2.
    used = energy_use(
        [GpuRun("a", 23 * H, 31 * H, 1.0)], epoch=SIM_EPOCH, gpu_watts=1000, tariff=TARIFF
    )
    assert used.energy_wh == pytest.approx(8000)
    assert used.cost == pytest.approx(1.2)
    assert used.cost_at_peak == pytest.approx(2.4)


def test_mark_offpeak_is_seeded_and_exact() -> None:
    trace = [job(i, 1, i, 10) for i in range(10)]
    once = mark_offpeak(trace, fraction=0.5, seed=7)
    assert sum(j.offpeak for j in once) == 5
    assert once == mark_offpeak(trace, fraction=0.5, seed=7)
    assert [j.job_id for j in once] == [j.job_id for j in trace]
    assert not any(j.offpeak for j in mark_offpeak(trace, fraction=0.0, seed=7))
    with pytest.raises(ValueError, match=r"within 0\.\.1"):
        mark_offpeak(trace, fraction=1.5, seed=7)


# --------------------------------------------------------------------------- CLI

TRACE_CSV = """job_id,user,vc,jobname,gpu_num,gpu_milli,submit_time,duration
1,u,v,a,1,1000,0,3600
2,u,v,b,1,1000,0,3600
"""


def _files(tmp_path: Path, windows: Any) -> list[str]:
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE_CSV)
    wfile = tmp_path / "windows.json"
    wfile.write_text(json.dumps(windows))
    tfile = tmp_path / "tariff.json"
    tfile.write_text(
        json.dumps(
            {
                "timezone": "UTC",
                "default_price_per_kwh": 0.30,
                "rules": [{"start": "00:00", "end": "06:00", "price_per_kwh": 0.10}],
            }
        )
    )
    # fmt: off
    return [
        "simulate", "--trace", str(trace), "--nodes", "1", "--gpus-per-node", "2",
        "--policy", "fifo", "--windows", str(wfile), "--tariff", str(tfile),
    ]
    # fmt: on


NIGHT_BODY = [{"name": "night", "timezone": "UTC", "daily": [{"start": "02:00", "end": "04:00"}]}]


def test_cli_prints_energy_and_cost_columns(tmp_path: Path) -> None:
    args = _files(tmp_path, NIGHT_BODY)
    # Both jobs off-peak: each runs 02:00-03:00 at 0.10; 2 x 1 h x 1000 W = 2 kWh -> 0.20.
    result = CliRunner().invoke(
        app, [*args, "--offpeak-fraction", "1", "--gpu-watts", "1000", "--json"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["offpeak_jobs"] == 2 and out["avg_jct_s"] == 3 * H
    assert out["energy_wh"] == pytest.approx(2000)
    assert out["cost"] == pytest.approx(0.20) and out["cost_at_peak"] == pytest.approx(0.60)

    table = CliRunner().invoke(app, [*args, "--offpeak-fraction", "1", "--gpu-watts", "1000"])
    assert table.exit_code == 0, table.output
    header = next(line for line in table.output.splitlines() if line.startswith("policy"))
    for column in ("avg JCT h", "preempt", "energy kWh", "cost", "cost@peak"):
        assert column in header
    fifo = next(line for line in table.output.splitlines() if line.startswith("fifo"))
    assert fifo.split()[-3:] == ["2.0", "0.20", "0.60"]


def test_cli_without_tariff_has_no_cost_columns(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE_CSV)
    result = CliRunner().invoke(
        app, ["simulate", "--trace", str(trace), "--nodes", "1", "--gpus-per-node", "2"]
    )
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if line.startswith("policy"))
    assert "energy kWh" in header and "cost" not in header


@pytest.mark.parametrize(
    ("windows", "expected"),
    [
        (
            [
                {
                    "name": "night",
                    "timezone": "Mars/Base",
                    "daily": [{"start": "02:00", "end": "04:00"}],
                }
            ],
            "window 0 ('night'): timezone: unknown time zone 'Mars/Base'",
        ),
        (
            [{"name": "n", "timezone": "UTC", "cron": "0 2 * * *"}],
            "duration_s: duration_s is required with cron",
        ),
        (
            [{"name": "n", "timezone": "UTC", "daily": [{"start": "25:00", "end": "04:00"}]}],
            "daily.0.start: time must be HH:MM",
        ),
        ([*NIGHT_BODY, *NIGHT_BODY], "window 1 ('night'): name: 'night' is repeated"),
        ({"name": "night"}, "must hold a non-empty JSON list"),
    ],
)
def test_cli_rejects_a_bad_windows_file(tmp_path: Path, windows: Any, expected: str) -> None:
    result = CliRunner().invoke(app, _files(tmp_path, windows))
    assert result.exit_code == 2
    assert expected in result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)  # a clean exit, not an escaped error


def test_cli_rejects_offpeak_without_windows_and_a_bad_tariff(tmp_path: Path) -> None:
    args = _files(tmp_path, NIGHT_BODY)
    no_windows = [a for a in args if a not in ("--windows", str(tmp_path / "windows.json"))]
    result = CliRunner().invoke(app, [*no_windows, "--offpeak-fraction", "0.5"])
    assert result.exit_code == 2 and "--offpeak-fraction needs --windows" in result.output
    (tmp_path / "tariff.json").write_text('{"timezone": "UTC"}')
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "not a valid tariff" in result.output
