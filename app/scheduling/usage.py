"""Pure helpers for fair-share usage and runtime prediction."""

from __future__ import annotations

import math
from collections.abc import Mapping
from statistics import median

from app.scheduling.types import JobView


def decay_usage(usage: float, elapsed_s: float, half_life_s: float) -> float:
    """Usage after `elapsed_s` of exponential decay with the given half-life.

    Old usage counts less so a team that used the cluster heavily last month is
    not punished forever (Slurm's PriorityDecayHalfLife).
    """
    if half_life_s <= 0:
        return 0.0
    if elapsed_s <= 0:
        return usage
    return usage * math.pow(0.5, elapsed_s / half_life_s)


def predict_runtime(
    history: Mapping[tuple[str, str], tuple[float, ...]] | Mapping[tuple[str, str], list[float]],
    job: JobView,
) -> float | None:
    """Median past runtime of the same user's jobs with the same name, or None.

    Repeated training runs of one model by one person have similar lengths
    (Helios, SC'21); the median shrugs off the odd crashed or extended run.
    """
    runs = history.get((job.user, job.name))
    if not runs:
        return None
    return float(median(runs))
