"""Energy and its price for the GPU time a simulation used (pure).

The simulator has no power telemetry, so every GPU a job holds is assumed to
draw a constant `gpu_watts` while the job runs, and nothing while idle (idle
draw is the same whatever the schedule, so it cannot change a comparison).
A job sharing a GPU draws its share of that figure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from app.windows.tariff import Tariff, cost_of_energy

#: An H100 SXM's board power limit (700 W). A training job draws somewhat less on
#: average, so energy and cost computed with it are an upper estimate.
DEFAULT_GPU_WATTS = 700.0


@dataclass(frozen=True, slots=True)
class GpuRun:
    """One stretch during which a job held GPUs: seconds after the simulated epoch."""

    job_id: str
    start_s: float
    end_s: float
    gpus: float  # GPU-equivalents: GPUs x share (a half-GPU job is 0.5)


@dataclass(frozen=True, slots=True)
class EnergyUse:
    energy_wh: float
    # Both None without a tariff.
    cost: float | None = None
    cost_at_peak: float | None = None


def energy_use(
    runs: Iterable[GpuRun], *, epoch: datetime, gpu_watts: float, tariff: Tariff | None
) -> EnergyUse:
    """Energy of `runs` (run time x GPUs x watts) and, with a tariff, its cost.

    Each run is priced at the times it actually ran: the tariff's own integration
    splits it at every price change, so a run across a cheap-to-expensive boundary
    pays each part at its price. `cost_at_peak` is the same energy at the tariff's
    highest price, the cost if nothing had been moved to cheap hours.
    """
    if gpu_watts < 0:
        raise ValueError("gpu_watts must be >= 0")
    total_wh = 0.0
    cost = 0.0
    for run in runs:
        seconds = run.end_s - run.start_s
        if seconds <= 0 or run.gpus <= 0:
            continue
        watts = run.gpus * gpu_watts
        if tariff is None:
            total_wh += watts * seconds / 3600.0
            continue
        # Two samples at constant power; no gap limit, since the run is known to be continuous.
        priced = cost_of_energy(
            tariff,
            [
                (epoch + timedelta(seconds=run.start_s), watts),
                (epoch + timedelta(seconds=run.end_s), watts),
            ],
            max_gap_s=math.inf,
        )
        total_wh += priced.energy_wh
        cost += priced.cost
    if tariff is None:
        return EnergyUse(energy_wh=total_wh)
    return EnergyUse(
        energy_wh=total_wh,
        cost=cost,
        cost_at_peak=total_wh / 1000.0 * tariff.max_price_per_kwh,
    )
