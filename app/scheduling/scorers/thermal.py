"""Scorer: cooler and less loaded GPUs first.

Score = mean over chosen GPUs of 1 - (0.5 * util/100 + 0.5 * heat), heat =
(temperature - 40 C) / 50 C clamped to 0..1. A hot GPU throttles its clocks;
a GPU with our shared jobs on it gives a newcomer fewer SM cycles. Missing
readings count as cool and idle (filters already rejected stale telemetry).
"""

from __future__ import annotations

from app.scheduling.state import NodeState, Request, Slot


def score(req: Request, node: NodeState, chosen: list[Slot]) -> float:
    if not chosen:
        return 1.0
    # Slot.cool = 1 - 0.5 util - 0.5 heat, computed once per cycle from telemetry.
    return sum(s.cool for s in chosen) / len(chosen)
