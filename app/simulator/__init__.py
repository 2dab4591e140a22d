"""Discrete-event trace simulator using the same pure `plan_cycle` as the live scheduler."""

from __future__ import annotations

from app.simulator.engine import (
    DEFAULT_PREEMPTION_COST_S,
    SimResult,
    percentile,
    shape_for,
    simulate,
)
from app.simulator.trace import TraceError, TraceJob, mark_offpeak, mark_preemptible, read_trace

__all__ = [
    "DEFAULT_PREEMPTION_COST_S",
    "SimResult",
    "TraceError",
    "TraceJob",
    "mark_offpeak",
    "mark_preemptible",
    "percentile",
    "read_trace",
    "shape_for",
    "simulate",
]
