"""Node rankers, one per module, combined as a weighted sum (weights in PolicySettings).

Order of importance by default: best fit (1.0) > topology (0.5) > thermal (0.25).
Packing matters most for the whole cluster's throughput; locality matters for
the job's own speed; temperature is a tie-breaker between similar nodes.
"""

from __future__ import annotations

from collections.abc import Callable

from app.scheduling.scorers import best_fit, thermal, topology
from app.scheduling.state import NodeState, Request, Slot
from app.scheduling.types import PolicySettings

Scorer = Callable[[Request, NodeState, list[Slot]], float]


def weighted(settings: PolicySettings) -> tuple[tuple[Scorer, float], ...]:
    pairs: tuple[tuple[Scorer, float], ...] = (
        (best_fit.score, settings.weight_best_fit),
        (topology.score, settings.weight_topology),
        (thermal.score, settings.weight_thermal),
    )
    return tuple((f, w) for f, w in pairs if w != 0.0)


def total(
    scorers: tuple[tuple[Scorer, float], ...], req: Request, node: NodeState, chosen: list[Slot]
) -> float:
    return sum(w * f(req, node, chosen) for f, w in scorers)


__all__ = ["Scorer", "best_fit", "thermal", "topology", "total", "weighted"]
