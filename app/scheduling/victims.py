"""What the victim search (preempt.py) knows about running jobs it might stop.

Types only, and the arithmetic of freeing GPUs: the cycle state holds these per cycle.
"""

from __future__ import annotations

from typing import NamedTuple

from app.scheduling.filters import enough_gpus, gpu_memory, gpu_share
from app.scheduling.state import Request, Slot
from app.scheduling.types import RunningJobView


class VictimRules(NamedTuple):
    """Which running jobs a job may stop: those of `borrowing` projects (quota
    reclaim), those below priority `above`, those in a LAS queue above `las_level`
    (None: the rule does not apply under this policy); under the default with
    `preempt_shorter_only`, only those of them expected to run longer than
    `las_longer_than` seconds more (the job's own expected run time; None: any)."""

    borrowing: frozenset[str]
    above: int | None
    las_level: int | None
    las_longer_than: float | None = None


class VictimHere(NamedTuple):
    """A preemptible running job as seen from one node it runs on."""

    id: int
    idxs: tuple[int, ...]  # its GPU indices on this node
    milli: int
    run: RunningJobView
    order: tuple[int, float, int]  # cheapest victims first: low priority, youngest, id

    @staticmethod
    def of(r: RunningJobView, node: str) -> VictimHere:
        idxs = tuple(i for nname, ix in r.placement if nname == node for i in ix)
        key = (r.job.priority, -r.started_at.timestamp(), r.job.id)
        return VictimHere(r.job.id, idxs, r.share_milli, r, key)


def victim_order(v: VictimHere) -> tuple[int, float, int]:
    return v.order


class NodeForPreempt:
    """What the victim search learnt about one node for one (model, memory) request,
    valid while the node's version is unchanged (and, if the node holds reserved GPUs,
    only for the job it was worked out for)."""

    __slots__ = ("_hopeless", "own", "pool", "useful", "useful_idx", "version")

    def __init__(
        self, version: int, own: int | None, useful: list[Slot], pool: list[VictimHere]
    ) -> None:
        self.version = version
        self.own = own
        self.useful = useful
        self.useful_idx = {sl.index for sl in useful}
        self.pool = pool
        self._hopeless: dict[Request, bool] = {}

    def hopeless(self, req: Request) -> bool:
        """True if even stopping every preemptible job on the node (whatever the rules
        say for this job) leaves fewer than `req.gpus` GPUs for it: an upper bound on
        what any allowed victim set can free."""
        got = self._hopeless.get(req)
        if got is None:
            freed: dict[int, int] = {}
            for v in self.pool:
                for i in v.idxs:
                    freed[i] = freed.get(i, 0) + v.milli
            got = self._hopeless[req] = not enough_gpus.fits(
                req.gpus, fits_after(self.useful, freed, req)
            )
        return got


def fits_after(useful: list[Slot], freed: dict[int, int], req: Request) -> int:
    """GPUs of `useful` (usable, suitable, not reserved for another) that fit `req`
    once `freed` (GPU index -> milli) is released on their node."""
    n = 0
    milli, memory_mb = req.milli, req.memory_mb
    for s in useful:
        f = freed.get(s.index, 0)
        if gpu_share.fits(milli, s.free_milli + f) and gpu_memory.fits(
            memory_mb, mem_after_release(s, f)
        ):
            n += 1
    return n


def mem_after_release(s: Slot, milli: int) -> int:
    if milli <= 0:
        return s.free_mem
    if s.free_milli + milli >= 1000:
        return s.mem_when_empty
    return s.free_mem
