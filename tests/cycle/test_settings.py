"""GPUSCHED_SCHEDULER_* settings reach the pure policy settings."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.cycle.settings import SchedulerSettings


def test_starvation_limit_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSCHED_SCHEDULER_STARVATION_AFTER_S", "7200")
    assert SchedulerSettings().policy_settings().starvation_after_s == 7200.0


def test_the_absolute_starvation_limit_is_off_by_default() -> None:
    # An absolute wait turns an overloaded cluster into FIFO (issue 41): off unless set.
    assert SchedulerSettings().policy_settings().starvation_after_s == 0.0
    assert SchedulerSettings(starvation_after_s=86400).policy_settings().starvation_after_s == 86400
    assert SchedulerSettings(starvation_after_s=0).policy_settings().starvation_after_s == 0.0


@pytest.mark.parametrize("limit", [-1, 3651 * 86400])
def test_starvation_limit_out_of_range_is_refused(limit: float) -> None:
    with pytest.raises(ValidationError, match="starvation_after_s"):
        SchedulerSettings(starvation_after_s=limit)


def test_the_preemption_cost_and_las_thresholds_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUSCHED_SCHEDULER_PREEMPTION_COST_S", "60")
    monkeypatch.setenv("GPUSCHED_SCHEDULER_LAS_THRESHOLDS_GPU_S", "[600, 7200, 86400]")
    policy = SchedulerSettings().policy_settings()
    assert (policy.preemption_cost_s, policy.las_thresholds_gpu_s) == (60.0, (600, 7200, 86400))


@pytest.mark.parametrize("thresholds", [[36000, 3600], [0, 3600], [3600, 3600]])
def test_las_thresholds_out_of_order_are_refused(thresholds: list[float]) -> None:
    with pytest.raises(ValidationError, match=r"(?s)las_thresholds_gpu_s.*positive and increasing"):
        SchedulerSettings(las_thresholds_gpu_s=tuple(thresholds))
