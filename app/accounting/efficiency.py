"""How well a job used the GPUs it held: pure computation from allocations and samples.

No database and no clock: the caller passes ``now`` and the rows (see service.py).  The
thresholds and the advice are explained in docs/efficiency.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from app.accounting.schemas import Flag, GpuEfficiency, JobEfficiency
from app.windows.tariff import Tariff, cost_of_energy, energy_wh

#: Below this average SM utilisation the job is flagged: the GPU mostly waits for input.
LOW_UTIL_PCT = 30.0
#: Peak memory below this fraction of the request: the request (or whole GPU) is too big.
MEMORY_UNDERUSED_FRACTION = 0.5
#: A GPU averaging below this is idle (a data-parallel rank that never got work).
IDLE_GPU_UTIL_PCT = 5.0
#: Fewer samples than this across the job: too little to judge, no flags raised.
MIN_SAMPLES_FOR_FLAGS = 3
#: Power samples further apart than this are not integrated (agent down, GPU released).
MAX_ENERGY_GAP_S = 300.0
#: Headroom added to the observed peak when advising a smaller memory request.
MEMORY_ADVICE_HEADROOM = 0.2


@dataclass(frozen=True, slots=True)
class JobFacts:
    job_id: int
    name: str
    project: str
    user: str
    status: str
    live: bool
    gpus: int
    gpu_memory_mb: int | None
    started_at: datetime | None
    finished_at: datetime | None
    # The last attempt's CPU time and peak host memory, from its nodes' fences (None:
    # still running, or not measured).
    cpu_s: float | None = None
    memory_peak_mb: int | None = None


@dataclass(frozen=True, slots=True)
class Held:
    """One allocation of one GPU: [start, end) with end None while it is still held."""

    node: str
    gpu_index: int
    model: str
    memory_total_mb: int
    share_milli: int
    start: datetime
    end: datetime | None


@dataclass(frozen=True, slots=True)
class Reading:
    """One telemetry sample of a GPU the job held, taken while it held it."""

    at: datetime
    node: str
    gpu_index: int
    util_pct: float | None
    memory_used_mb: int | None
    power_w: float | None
    resolution_s: int


GpuKey = tuple[str, int]


def gpu_hours(held: Iterable[Held], *, now: datetime, since: datetime | None = None) -> float:
    """Sum of (released_at or now) - created_at, times the share, in hours (clipped)."""
    total = 0.0
    for h in held:
        start = h.start if since is None else max(h.start, since)
        end = min(h.end or now, now)
        total += max(0.0, (end - start).total_seconds()) * h.share_milli / 1000
    return total / 3600


def _weighted_mean(pairs: Sequence[tuple[float, int]]) -> float | None:
    # Raw samples (5 s) and per-minute roll-ups may mix: weigh each by the time it stands for.
    weight = sum(max(w, 1) for _, w in pairs)
    if not pairs or weight == 0:
        return None
    return sum(v * max(w, 1) for v, w in pairs) / weight


def _per_gpu(
    key: GpuKey,
    held: list[Held],
    readings: list[Reading],
    *,
    now: datetime,
    since: datetime | None,
    tariff: Tariff | None,
) -> GpuEfficiency:
    first = held[0]
    share = max(h.share_milli for h in held) / 1000
    utils = [(r.util_pct, r.resolution_s) for r in readings if r.util_pct is not None]
    memories = [r.memory_used_mb for r in readings if r.memory_used_mb is not None]
    power = [(r.at, r.power_w) for r in readings if r.power_w is not None]
    avg = _weighted_mean(utils)
    priced = cost_of_energy(tariff, power, MAX_ENERGY_GAP_S) if tariff is not None else None
    return GpuEfficiency(
        node=key[0],
        gpu_index=key[1],
        model=first.model,
        memory_total_mb=first.memory_total_mb,
        share=share,
        held_s=gpu_hours(
            [
                Held(h.node, h.gpu_index, h.model, h.memory_total_mb, 1000, h.start, h.end)
                for h in held
            ],
            now=now,
            since=since,
        )
        * 3600,
        samples=len(readings),
        avg_util_pct=avg,
        peak_util_pct=max((u for u, _ in utils), default=None),
        peak_memory_mb=max(memories, default=None),
        energy_wh=energy_wh(power, MAX_ENERGY_GAP_S) * share,
        cost=priced.cost * share if priced else None,
        cost_at_peak=priced.cost_at_peak * share if priced else None,
        idle=avg is not None and avg < IDLE_GPU_UTIL_PCT,
    )


def _sum_present(values: Iterable[float | None]) -> float:
    return sum(v for v in values if v is not None)


def _name(gpu: GpuEfficiency) -> str:
    return f"{gpu.node}/gpu{gpu.gpu_index}"


def _flags(
    gpus: list[GpuEfficiency],
    *,
    peak_memory: int | None,
    requested: int | None,
    basis: str | None,
) -> list[Flag]:
    flags: list[Flag] = []
    measured = [g for g in gpus if g.avg_util_pct is not None]
    idle = [g for g in measured if g.idle]
    busy = [g for g in measured if not g.idle]
    if idle and busy:
        who = (
            f"only {_name(busy[0])} was busy"
            if len(busy) == 1
            else f"{len(busy)} of {len(measured)} GPUs were busy"
        )
        flags.append(
            Flag(
                code="idle_gpus",
                message=(
                    f"{who}; {', '.join(_name(g) for g in idle)} stayed idle "
                    f"(average utilisation below {IDLE_GPU_UTIL_PCT:g}%)"
                ),
                advice=(
                    "the job is not using its data-parallel ranks: start it with torchrun "
                    "(one process per GPU) and wrap the model in DistributedDataParallel, and "
                    "check that the code does not pin CUDA_VISIBLE_DEVICES or cuda:0 itself; "
                    f"otherwise ask for {len(busy)} GPU(s)"
                ),
            )
        )
    # With idle ranks flagged, judge the pipeline on the GPUs that did work.
    basis_gpus = busy if (idle and busy) else measured
    if basis_gpus:
        avg = sum(g.avg_util_pct or 0.0 for g in basis_gpus) / len(basis_gpus)
        if avg < LOW_UTIL_PCT:
            flags.append(
                Flag(
                    code="low_utilisation",
                    message=(
                        f"average SM utilisation {avg:.0f}% (below {LOW_UTIL_PCT:g}%): the GPUs "
                        "mostly wait"
                    ),
                    advice=(
                        "the input pipeline or the CPU is the bottleneck: use more data-loader "
                        "workers (num_workers), pinned memory (pin_memory=True) and a larger "
                        "batch; profile the step to see where the time goes"
                    ),
                )
            )
    if (
        peak_memory is not None
        and requested is not None
        and peak_memory < MEMORY_UNDERUSED_FRACTION * requested
    ):
        suggested = int(peak_memory * (1 + MEMORY_ADVICE_HEADROOM))
        what = "requested" if basis == "requested" else "available on the GPU"
        gpu_total = min((g.memory_total_mb for g in gpus), default=requested)
        # The next tenth of a GPU above the suggested memory: gpu_share is a fraction of one.
        fraction = max(0.1, min(1.0, math.ceil(10 * suggested / gpu_total) / 10))
        flags.append(
            Flag(
                code="memory_underused",
                message=(
                    f"peak memory {peak_memory} MiB is {peak_memory / requested:.0%} of the "
                    f"{requested} MiB {what}"
                ),
                advice=(
                    f"ask for less (gpu_memory_mb={suggested}, the peak plus "
                    f"{MEMORY_ADVICE_HEADROOM:.0%}) or share a GPU (gpu_share={fraction:g}) so "
                    "another job can use the rest"
                ),
            )
        )
    return flags


def compute(
    job: JobFacts,
    held: Sequence[Held],
    readings: Iterable[Reading],
    *,
    now: datetime,
    since: datetime | None = None,
    until: datetime | None = None,
    tariff: Tariff | None = None,
) -> JobEfficiency:
    """The job's efficiency over [since, until] (default: its whole life up to ``now``).
    With a time-of-use tariff, energy is also priced, and priced again at peak."""
    end = now if until is None else min(until, now)
    gpu_held = [h for h in held if since is None or (h.end or end) >= since]
    groups: dict[GpuKey, list[Held]] = {}
    for h in gpu_held:
        groups.setdefault((h.node, h.gpu_index), []).append(h)
    samples: dict[GpuKey, list[Reading]] = {key: [] for key in groups}
    for r in readings:
        if (since is None or r.at >= since) and r.at <= end and (r.node, r.gpu_index) in samples:
            samples[(r.node, r.gpu_index)].append(r)
    for rows in samples.values():
        rows.sort(key=lambda r: r.at)
    per_gpu = [
        _per_gpu(key, groups[key], samples[key], now=end, since=since, tariff=tariff)
        for key in sorted(groups)
    ]
    measured = [g for g in per_gpu if g.avg_util_pct is not None]
    n_samples = sum(g.samples for g in per_gpu)
    avg_util = sum(g.avg_util_pct or 0.0 for g in measured) / len(measured) if measured else None
    peak_memory = max(
        (g.peak_memory_mb for g in per_gpu if g.peak_memory_mb is not None), default=None
    )
    requested: int | None
    basis: Literal["requested", "gpu_total"] | None
    if job.gpu_memory_mb is not None:
        requested, basis = job.gpu_memory_mb, "requested"
    elif per_gpu:
        requested = min(int(g.memory_total_mb * g.share) for g in per_gpu)
        basis = "gpu_total"
    else:
        requested, basis = None, None
    hours = gpu_hours(gpu_held, now=end, since=since)
    notes: list[str] = []
    flags: list[Flag] = []
    if not gpu_held:
        notes.append("the job has held no GPU in this period: nothing to measure")
    elif n_samples == 0:
        notes.append("no telemetry for the GPUs the job held while it held them")
    elif n_samples < MIN_SAMPLES_FOR_FLAGS:
        notes.append(f"only {n_samples} sample(s): too little telemetry to judge")
    else:
        flags = _flags(per_gpu, peak_memory=peak_memory, requested=requested, basis=basis)
    unmeasured = [g for g in per_gpu if g.samples == 0]
    if unmeasured and n_samples:
        notes.append(
            "no telemetry for " + ", ".join(_name(g) for g in unmeasured) + ": left out of averages"
        )
    if job.live:
        notes.append("the job is still running: figures so far")
    wall_s = (
        (job.finished_at - job.started_at).total_seconds()
        if job.started_at is not None and job.finished_at is not None
        else None
    )
    if any(g.share < 1 for g in per_gpu):
        notes.append(
            "on a shared GPU utilisation and memory are the whole GPU's; energy is scaled by share"
        )
    return JobEfficiency(
        job_id=job.job_id,
        name=job.name,
        project=job.project,
        user=job.user,
        status=job.status,
        live=job.live,
        gpus=job.gpus,
        started_at=job.started_at,
        finished_at=job.finished_at,
        period_start=since,
        period_end=end,
        gpu_hours=hours,
        samples=n_samples,
        avg_util_pct=avg_util,
        peak_util_pct=max(
            (g.peak_util_pct for g in per_gpu if g.peak_util_pct is not None), default=None
        ),
        peak_memory_mb=peak_memory,
        memory_requested_mb=requested,
        memory_basis=basis,
        memory_used_pct=(
            100.0 * peak_memory / requested if peak_memory is not None and requested else None
        ),
        energy_wh=sum(g.energy_wh for g in per_gpu),
        cost=_sum_present(g.cost for g in per_gpu) if tariff is not None else None,
        cost_at_peak=_sum_present(g.cost_at_peak for g in per_gpu) if tariff is not None else None,
        idle_gpus=sum(1 for g in per_gpu if g.idle),
        cpu_s=job.cpu_s,
        cpu_cores_avg=job.cpu_s / wall_s if job.cpu_s is not None and wall_s else None,
        host_memory_peak_mb=job.memory_peak_mb,
        wasted_gpu_hours=hours * (1 - avg_util / 100) if avg_util is not None else 0.0,
        per_gpu=per_gpu,
        flags=flags,
        notes=notes,
    )
