"""Job x cluster filter: a gang finds enough nodes.

A job of `nodes` > 1 starts on that many nodes at once or not at all (each with
`gpus` suitable GPUs, see enough_gpus.py). `fits` is the one test of that: placement
counts candidate nodes, the victim search nodes with a victim set, the backfill
reservation nodes with room by then, the explanation nodes at each level.
"""

from __future__ import annotations


def fits(nodes: int, nodes_with_room: int) -> bool:
    """Whether `nodes_with_room` nodes (each with enough GPUs for it) start a job of
    `nodes` nodes (`Request.nodes`)."""
    return nodes_with_room >= nodes
