"""Job x node filter: the node has enough suitable GPUs (and, for gangs, enough nodes).

`fits` is the one per-node count test of the scheduler (placement, the victim search,
the backfill reservation, the explanation). `never` compares the
request with the cluster's hardware regardless of current load or state, so
a job asking 9 GPUs per node on 8-GPU nodes is told it can never run.
"""

from __future__ import annotations

from app.scheduling.filters import enough_nodes, gpu_memory, gpu_model
from app.scheduling.state import HardwareClass, Request
from app.scheduling.status import OK, Status, unresolvable
from app.scheduling.types import ReasonKind


def fits(gpus: int, suitable_on_node: int) -> bool:
    """Whether a node with `suitable_on_node` GPUs that fit a job has the `gpus` it asks
    for on each node (`Request.gpus`)."""
    return suitable_on_node >= gpus


def never(req: Request, hardware: tuple[HardwareClass, ...]) -> Status:
    if not hardware:
        return unresolvable(ReasonKind.NEVER_FITS, "no node could ever fit: cluster has no nodes")
    counts = [
        (
            sum(
                1
                for model, mem in hc.gpus
                if gpu_model.fits(req.model, model) and gpu_memory.fits(req.memory_mb, mem)
            ),
            hc,
        )
        for hc in hardware
    ]
    best, best_hc = max(counts, key=lambda c: c[0])
    if not fits(req.gpus, best):
        return unresolvable(
            ReasonKind.NEVER_FITS,
            f"no node could ever fit: largest node has {best} GPUs ({best_hc.example})",
        )
    enough = sum(hc.nodes for c, hc in counts if fits(req.gpus, c))
    if not enough_nodes.fits(req.nodes, enough):
        return unresolvable(
            ReasonKind.NEVER_FITS,
            f"no placement could ever fit: needs {req.nodes} nodes with {req.gpus} GPUs, "
            f"cluster has {enough}",
        )
    return OK
