"""Scorer: best fit, so whole nodes stay free for large jobs.

Score = 1 - (free capacity left on the node after placing) / (node capacity),
in milli-GPUs over usable GPUs. Filling the fullest node that still fits
limits fragmentation: an 8-GPU job needs a whole empty node, and scattering
1-GPU jobs over empty nodes would leave none. A 1-GPU job scores 1.0 on a
node with exactly one free GPU and 0.125 on an empty 8-GPU node.
"""

from __future__ import annotations

from app.scheduling.state import NodeState, Request, Slot


def score(req: Request, node: NodeState, chosen: list[Slot]) -> float:
    # node.usable / node.free_sum are kept current by the cycle's node index.
    if not node.usable:
        return 0.0
    free_after = node.free_sum - req.milli * len(chosen)
    return 1.0 - max(0, free_after) / (1000 * node.usable)
