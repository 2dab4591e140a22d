"""Discrete-event trace simulator using the same pure `plan_cycle` as the live scheduler."""

from __future__ import annotations

from app.simulator.engine import SimResult, percentile, shape_for, simulate
from app.simulator.trace import TraceJob, mark_offpeak, read_trace

__all__ = [
    "SimResult",
    "TraceJob",
    "mark_offpeak",
    "percentile",
    "read_trace",
    "shape_for",
    "simulate",
]
