"""The quality bench's three checks of issue 41's goal (`bench/scheduling_quality.py`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from app.simulator import SimResult
from bench.scheduling_quality import trace_files, verdict


def result(policy: str, avg: float, p99: float, util: float = 0.7, makespan: float = 1000):
    return SimResult(policy, 10, 0, avg, avg, p99, 0.0, makespan, util, 0, {}, {})


# sjf has the best average; its p99 (600) is above 1.10 x fifo's (400), so the default
# need only stay within 1.10 x sjf's p99: 640 / 600 = 1.067. Average 52 / 50 = 1.04;
# utilisation 0.69 / 0.7 = 0.986, makespan 1.01.
RESULTS = {
    "fifo": result("fifo", 100, 400),
    "sjf": result("sjf", 50, 600),
    "las": result("las", 60, 300),
    "default": result("default", 52, 640, util=0.69, makespan=1010),
}


def test_all_three_hold() -> None:
    v = verdict(RESULTS)
    assert v.best == "sjf"
    assert v.avg_ratio == pytest.approx(1.04)
    assert v.p99_vs_best == pytest.approx(640 / 600)
    assert not v.fifo_tail_applies
    assert v.holds == (True, True, True)


@pytest.mark.parametrize(
    ("change", "holds"),
    [
        # 55 / 50 = 1.10 > 1.05
        ({"default": result("default", 55, 640, util=0.69, makespan=1010)}, (False, True, True)),
        # 670 / 600 = 1.117 > 1.10 of the best-average policy's p99
        ({"default": result("default", 52, 670, util=0.69, makespan=1010)}, (True, False, True)),
        # sjf's p99 420 is within 1.10 x fifo's (440), so the default must be too: 450 is not
        (
            {"sjf": result("sjf", 50, 420), "default": result("default", 52, 450)},
            (True, False, True),
        ),
        # utilisation 0.68 / 0.7 = 0.971 < 0.98
        ({"default": result("default", 52, 640, util=0.68)}, (True, True, False)),
        # makespan 1,030 / 1,000 = 1.03 > 1.02
        ({"default": result("default", 52, 640, makespan=1030)}, (True, True, False)),
    ],
)
def test_each_check_fails_on_its_own(change: dict[str, SimResult], holds: tuple) -> None:
    assert verdict({**RESULTS, **change}).holds == holds


def test_the_best_average_may_be_las() -> None:
    las = replace(RESULTS["las"], avg_jct_s=40)
    v = verdict({**RESULTS, "las": las})
    assert v.best == "las" and v.avg_ratio == pytest.approx(52 / 40)
    assert v.holds[0] is False


def test_no_trace_to_replay_is_an_error_not_an_empty_result(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no trace files"):
        trace_files(tmp_path, None)
    (tmp_path / "a.csv").write_text("")
    with pytest.raises(SystemExit, match=r"no trace b\.csv"):
        trace_files(tmp_path, ["a.csv", "b.csv"])
    assert trace_files(tmp_path, ["a.csv"]) == [tmp_path / "a.csv"]
