"""Mutable per-cycle working state built from the frozen snapshot.

Only `plan_cycle` creates and mutates it; nothing outside a single call sees it.
Free whole GPUs are indexed by node in buckets (bucket k = nodes with k usable,
unreserved, wholly free GPUs) so a placement looks at the tightest nodes
first and never scans the whole cluster.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import NamedTuple

from app.scheduling.status import Status
from app.scheduling.types import GpuView, JobView, NodeView


class Request(NamedTuple):
    """What a job asks of each node: the shape that placement and caches key on.

    A NamedTuple, not a dataclass: it is built for every pending job every cycle
    and used as a dict key, and tuple creation and hashing run in C.
    """

    gpus: int
    nodes: int
    milli: int
    memory_mb: int
    model: str | None
    # Nodes going into maintenance before this job's time limit would end: not for it.
    barred: frozenset[str] = frozenset()

    @staticmethod
    def of(job: JobView) -> Request:
        gpus = job.gpus if job.gpus > 0 else 0
        share = job.gpu_share
        # Sharing is defined only for single-GPU jobs; a multi-GPU job takes whole GPUs.
        milli = 1000 if gpus != 1 or share is None or share >= 1.0 else max(1, round(share * 1000))
        return Request(
            gpus, job.nodes if job.nodes > 1 else 1, milli, job.gpu_memory_mb or 0, job.gpu_model
        )


class HardwareClass(NamedTuple):
    """Nodes with identical GPUs, for the can-never-fit checks (1000 nodes -> a few classes)."""

    example: str  # first node (in snapshot order) with this hardware
    nodes: int
    gpus: tuple[tuple[str, int], ...]  # (model, memory_total_mb) per GPU


def hardware_classes(nodes: tuple[NodeView, ...]) -> tuple[HardwareClass, ...]:
    """Group all nodes, whatever their state, by GPU hardware: what the cluster *could* run."""
    groups: dict[tuple[tuple[str, int], ...], list[str]] = {}
    for n in nodes:
        sig = tuple(sorted([(g.model, g.memory_total_mb) for g in n.gpus]))
        groups.setdefault(sig, []).append(n.name)
    return tuple(HardwareClass(names[0], len(names), sig) for sig, names in groups.items())


class Slot:
    """One GPU during a cycle."""

    __slots__ = (
        "_cool",
        "blocker",
        "booked_mem",
        "foreign_mem",
        "free_mem",
        "free_milli",
        "index",
        "init_free_mem",
        "init_free_milli",
        "model",
        "node_name",
        "peers",
        "reserved_for",
        "temp",
        "total_mem",
        "unchecked",
        "util",
    )

    def __init__(
        self,
        node_name: str,
        index: int,
        model: str,
        total_mem: int,
        free_mem: int,
        free_milli: int,
        blocker: Status | None,
        temp: float | None,
        util: float | None,
        peers: frozenset[int],
        foreign_mem: int,
    ) -> None:
        # The node's name, not its NodeState: a slot pointing back at the node that lists
        # it made each cycle's 8,000 slots (at 1,000 nodes) garbage in reference cycles,
        # which only the cyclic collector frees: 7-25 ms after every live cycle.
        self.node_name = node_name
        self.index = index
        self.model = model
        self.total_mem = total_mem
        self.free_mem = free_mem
        self.free_milli = free_milli
        self.init_free_milli = free_milli
        self.init_free_mem = free_mem
        self.blocker = blocker
        self.temp = temp
        self.util = util
        # Thermal score of this GPU alone (see scorers/thermal.py), fixed for the cycle;
        # worked out on first use: most GPUs are never a candidate in a cycle.
        self._cool: float | None = None
        self.peers = peers
        self.foreign_mem = foreign_mem
        self.booked_mem = 0
        self.reserved_for: int | None = None
        # (node, GPU) views whose GPU filters have not run yet (GPU fully ours at build).
        self.unchecked: tuple[NodeView, GpuView] | None = None

    @property
    def cool(self) -> float:
        cool = self._cool
        if cool is None:
            u = min(100.0, max(0.0, self.util or 0.0)) / 100.0
            t = self.temp
            heat = 0.0 if t is None else min(1.0, max(0.0, (t - 40.0) / 50.0))
            cool = self._cool = 1.0 - 0.5 * u - 0.5 * heat
        return cool

    @property
    def mem_when_empty(self) -> int:
        """Free memory once none of our jobs is left on it: all but the foreign use."""
        return self.total_mem - self.foreign_mem

    @property
    def usable(self) -> bool:
        return self.blocker is None

    def __repr__(self) -> str:
        return f"Slot({self.node_name}:{self.index} free={self.free_milli})"


class Choice:
    """A node's GPU pick for one request shape, valid while `NodeState.version` is unchanged."""

    __slots__ = ("picked", "score", "version")

    def __init__(self, version: int, picked: list[Slot] | None) -> None:
        self.version = version
        self.picked = picked
        self.score: float | None = None  # weighted scorer total, filled when ranked


class NodeState:
    __slots__ = (
        "blocker",
        "free_sum",
        "free_whole",
        "gpu_count",
        "has_partial",
        "memo",
        "models",
        "name",
        "rank",
        "slots",
        "usable",
        "version",
    )

    def __init__(self, name: str, rank: int, blocker: Status | None) -> None:
        self.name = name
        self.rank = rank
        self.blocker = blocker
        self.slots: list[Slot] = []
        self.free_whole = 0
        self.gpu_count = 0
        # Maintained by count_free_whole(): usable GPUs, their free milli, any partly used.
        self.usable = 0
        self.free_sum = 0
        self.has_partial = False
        self.models: frozenset[str] = frozenset()
        # Bumped by NodeIndex.refresh, which every change to the node's GPUs goes
        # through; `memo` caches GPU picks per (request, may use reserved GPUs), keyed
        # by a small int the cycle hands out per such pair.
        self.version = 0
        self.memo: dict[int, Choice] = {}

    def count_free_whole(self) -> int:
        """Recount the node's totals; returns usable, unreserved, wholly free GPUs."""
        whole = usable = free_sum = 0
        partial = False
        for s in self.slots:
            if s.blocker is None:
                usable += 1
                fm = s.free_milli
                free_sum += fm
                if fm == 1000:
                    if s.reserved_for is None:
                        whole += 1
                elif fm > 0:
                    partial = True
        self.usable = usable
        self.free_sum = free_sum
        self.has_partial = partial
        return whole


class NodeIndex:
    """Buckets of nodes by number of usable, unreserved, wholly free GPUs."""

    __slots__ = ("buckets", "max_gpus", "partial")

    def __init__(self, nodes: list[NodeState]) -> None:
        self.max_gpus = max((n.gpu_count for n in nodes), default=0)
        self.buckets: list[list[tuple[int, str]]] = [[] for _ in range(self.max_gpus + 1)]
        # Nodes with a usable GPU that is partly allocated to shared jobs.
        self.partial: dict[str, NodeState] = {}
        for n in nodes:
            n.free_whole = n.count_free_whole()
            if n.blocker is None:
                self.buckets[n.free_whole].append((n.rank, n.name))
                self._track_partial(n)
        for b in self.buckets:
            b.sort()

    def _track_partial(self, n: NodeState) -> None:
        if n.has_partial:
            self.partial[n.name] = n
        else:
            self.partial.pop(n.name, None)

    def refresh(self, n: NodeState) -> None:
        """Re-file a node after its slots changed."""
        n.version += 1
        if n.blocker is not None:
            return
        new = n.count_free_whole()
        if new != n.free_whole:
            old_bucket = self.buckets[n.free_whole]
            key = (n.rank, n.name)
            i = bisect_left(old_bucket, key)
            if i < len(old_bucket) and old_bucket[i] == key:
                del old_bucket[i]
            insort(self.buckets[new], key)
            n.free_whole = new
        self._track_partial(n)

    def largest_free_block(self) -> int:
        for k in range(self.max_gpus, 0, -1):
            if self.buckets[k]:
                return k
        return 0
