"""Scorer: NVLink locality for multi-GPU jobs.

Score = share of GPU pairs in the chosen set that are NVLink peers (1.0 for a
single GPU). All-reduce over PCIe between GPUs without NVLink can be several
times slower, so a node where the job gets a connected set wins.
"""

from __future__ import annotations

from app.scheduling.state import NodeState, Request, Slot


def score(req: Request, node: NodeState, chosen: list[Slot]) -> float:
    n = len(chosen)
    if n <= 1:
        return 1.0
    linked = sum(1 for i in range(n) for j in range(i + 1, n) if chosen[j].index in chosen[i].peers)
    return linked / (n * (n - 1) // 2)
