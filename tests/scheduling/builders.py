"""Fluent builders for scheduling case tables: `node("a").gpus(8, mem_gb=80).util(30)`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from app.scheduling import (
    GpuView,
    JobView,
    NodeView,
    PolicySettings,
    ProjectView,
    RunningJobView,
    Snapshot,
    UserView,
    WindowInterval,
)

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def at(seconds: float = 0.0) -> datetime:
    return T0 + timedelta(seconds=seconds)


class NodeBuilder:
    def __init__(self, name: str) -> None:
        self.name = name
        self._ready = True
        self._drained = False
        self._heartbeat: datetime | None = T0
        self._gpus: list[dict[str, Any]] = []
        self._labels: tuple[tuple[str, str], ...] = ()
        self._maintenance_at: datetime | None = None
        self._unusable: tuple[tuple[str, str], ...] = ()

    def lacks(self, account: str, why: str = "no such account on this node") -> NodeBuilder:
        """Its agent cannot run jobs as this Unix account."""
        self._unusable = (*self._unusable, (account, why))
        return self

    def gpus(self, n: int, mem_gb: int = 80, model: str = "A100") -> NodeBuilder:
        for _ in range(n):
            self._gpus.append(
                dict(
                    index=len(self._gpus),
                    uuid=f"{self.name}-{len(self._gpus)}",
                    model=model,
                    memory_total_mb=mem_gb * 1024,
                    memory_used_mb=0,
                    util_pct=0.0,
                    telemetry_at=T0,
                    idle_since=T0 - timedelta(hours=1),
                    temperature_c=40.0,
                )
            )
        return self

    def _set(self, idx: int | None, **kw: Any) -> NodeBuilder:
        targets = self._gpus if idx is None else [self._gpus[idx]]
        for g in targets:
            g.update(kw)
        return self

    def util(self, pct: float, idx: int | None = None) -> NodeBuilder:
        return self._set(idx, util_pct=pct)

    def temp(self, c: float, idx: int | None = None) -> NodeBuilder:
        return self._set(idx, temperature_c=c)

    def alloc(self, idx: int, milli: int = 1000) -> NodeBuilder:
        return self._set(idx, allocated_milli=milli)

    def used_mem(self, idx: int, mb: int) -> NodeBuilder:
        return self._set(idx, memory_used_mb=mb)

    def foreign(
        self, idx: int, util_pct: float = 90.0, mem_mb: int = 0, idle_for_s: float | None = None
    ) -> NodeBuilder:
        """Foreign load now (util >= threshold), or a GPU idle of foreign load for idle_for_s."""
        if idle_for_s is not None:
            return self._set(
                idx, foreign_util_pct=util_pct, idle_since=T0 - timedelta(seconds=idle_for_s)
            )
        return self._set(
            idx,
            foreign_util_pct=util_pct,
            foreign_memory_mb=mem_mb,
            memory_used_mb=mem_mb,
            foreign_since=T0 - timedelta(seconds=30),
            idle_since=None,
        )

    def unhealthy(self, idx: int) -> NodeBuilder:
        return self._set(idx, healthy=False)

    def stale(self, idx: int | None = None, age_s: float = 300) -> NodeBuilder:
        return self._set(idx, telemetry_at=T0 - timedelta(seconds=age_s))

    def heartbeat(self, age_s: float | None) -> NodeBuilder:
        self._heartbeat = None if age_s is None else T0 - timedelta(seconds=age_s)
        return self

    def not_ready(self) -> NodeBuilder:
        self._ready = False
        return self

    def drained(self) -> NodeBuilder:
        self._drained = True
        return self

    def maintenance(self, in_s: float) -> NodeBuilder:
        """Maintenance from `in_s` seconds after T0 (at or before it: begun)."""
        self._maintenance_at = at(in_s)
        return self

    def nvlink(self, *groups: tuple[int, ...]) -> NodeBuilder:
        """Each group is fully NVLink-connected."""
        for grp in groups:
            for i in grp:
                peers = set(self._gpus[i].get("nvlink_peers", ())) | (set(grp) - {i})
                self._gpus[i]["nvlink_peers"] = tuple(sorted(peers))
        return self

    def build(self) -> NodeView:
        return NodeView(
            name=self.name,
            ready=self._ready,
            drained=self._drained,
            labels=self._labels,
            heartbeat_at=self._heartbeat,
            gpus=tuple(GpuView(**g) for g in self._gpus),
            maintenance_at=self._maintenance_at,
            unusable_accounts=self._unusable,
        )


def node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


def job(id: int, **kw: Any) -> JobView:
    """A pending job submitted `id` seconds after T0 - 1h unless told otherwise."""
    kw.setdefault("name", f"job{id}")
    kw.setdefault("submitted_at", T0 - timedelta(hours=1) + timedelta(seconds=id))
    return JobView(id=id, **kw)


def running(
    j: JobView,
    placement: dict[str, tuple[int, ...]],
    started_ago_s: float = 3600,
    share: float = 1.0,
) -> RunningJobView:
    return RunningJobView(
        job=j,
        placement=tuple((n, tuple(g)) for n, g in placement.items()),
        started_at=T0 - timedelta(seconds=started_ago_s),
        share=share,
    )


def project(name: str, quota: int = 0, weight: float = 1.0, usage: float = 0.0) -> ProjectView:
    return ProjectView(name=name, quota_gpus=quota, weight=weight, usage_gpu_s=usage)


def window(name: str, opens_s: float, closes_s: float) -> WindowInterval:
    return WindowInterval(name=name, opens_at=at(opens_s), closes_at=at(closes_s))


def snap(
    nodes: Sequence[NodeBuilder | NodeView],
    pending: Sequence[JobView] = (),
    running: Sequence[RunningJobView] = (),
    projects: Sequence[ProjectView] = (),
    windows: Sequence[WindowInterval] = (),
    history: dict[tuple[str, str], tuple[float, ...]] | None = None,
    users: Sequence[UserView] = (),
) -> Snapshot:
    """Build a snapshot; GPU allocated_milli is derived from the running jobs."""
    built = [n.build() if isinstance(n, NodeBuilder) else n for n in nodes]
    alloc: dict[tuple[str, int], int] = {}
    for r in running:
        milli = 1000 if r.share >= 1 else round(r.share * 1000)
        for name, idxs in r.placement:
            for i in idxs:
                alloc[(name, i)] = alloc.get((name, i), 0) + milli
    final = []
    for n in built:
        gpus = tuple(
            replace(g, allocated_milli=g.allocated_milli + alloc.get((n.name, g.index), 0))
            for g in n.gpus
        )
        final.append(replace(n, gpus=gpus))
    return Snapshot(
        nodes=tuple(final),
        pending=tuple(pending),
        running=tuple(running),
        projects=tuple(projects),
        windows=tuple(windows),
        users=tuple(users),
        runtime_history=history or {},
    )


def settings(**kw: Any) -> PolicySettings:
    return PolicySettings(**kw)


def apply(s: Snapshot, p: Any, now: datetime) -> Snapshot:
    """The state after a plan is carried out: victims back to pending, placed jobs running.

    GPU allocations are recomputed from the running jobs (nodes are assumed to carry
    no allocations of their own).
    """
    victims = {x.victim_job_id for x in p.preemptions}
    still = [r for r in s.running if r.job.id not in victims]
    requeued = [
        replace(r.job, attempt=r.job.attempt + 1, last_preempted_at=now)
        for r in s.running
        if r.job.id in victims
    ]
    placed = {pl.job_id: pl for pl in p.placements}
    by_id = {j.id: j for j in s.pending}
    started = [
        RunningJobView(
            job=by_id[jid],
            placement=pl.node_gpus,
            started_at=now,
            share=pl.share,
            started_via_preemption=bool(pl.after_preemption_of),
        )
        for jid, pl in placed.items()
    ]
    pending = [j for j in s.pending if j.id not in placed] + requeued
    bare = [replace(n, gpus=tuple(replace(g, allocated_milli=0) for g in n.gpus)) for n in s.nodes]
    return snap(
        bare,
        pending=pending,
        running=still + started,
        projects=list(s.projects),
        windows=list(s.windows),
        history=dict(s.runtime_history),
    )
