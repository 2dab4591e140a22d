"""Fits and advice for one GPU: does the request fit, and which changes make it fit.

Every suggestion is the request with its changes applied, estimated again from scratch
(:func:`app.estimator.memory.evaluate`): its memory, its verdict and its warnings are
those of that re-estimate, never a guess.  The search runs over precision x sharding x
checkpointing, each with the largest micro-batch that fits on the requested GPUs, or with
the fewest data-parallel GPUs that fit (sharded states shrink with d).  Of the fixes that
fit, those on more GPUs are dropped when one fits on the requested GPUs, and those that
change more than another fitting fix; the rest come cheapest first: no new warning, then
fewest GPUs, then the least throughput cost.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from pydantic import ValidationError

from app.estimator.memory import (
    GIB,
    MIB,
    SHARDING_LEVEL,
    Evaluation,
    Setup,
    evaluate,
    memory,
    training_time,
)
from app.estimator.schemas import (
    EstimateRequest,
    GpuFit,
    GpuModelSpec,
    Precision,
    Sharding,
    Suggestion,
    SuggestionKind,
    TrainingTime,
)

#: Upper bound of the data-parallel searches.
MAX_DATA_PARALLEL = 2**16
#: Throughput cost of each change, to rank fixes on the same GPU count: mixed precision and
#: each ZeRO stage (more communication) 1, checkpointing 3 (a third more compute), a
#: smaller micro-batch 4 (GPUs run less efficiently on small matrices).
PENALTY_PRECISION = 1
PENALTY_PER_ZERO_STAGE = 1
PENALTY_CHECKPOINTING = 3
PENALTY_MICRO_BATCH = 4

_SHARDINGS: tuple[Sharding, ...] = ("none", "zero1", "zero2", "zero3")
_SHARDED_WHAT = {
    "zero1": "optimizer states",
    "zero2": "gradients and optimizer states",
    "zero3": "weights, gradients and optimizer states",
}


@dataclass(frozen=True)
class Target:
    """The memory advice is judged against: a GPU model, or an explicit target."""

    gpu_model: str | None  # None: the request's target_gpu_memory_mb
    memory_mb: int

    @property
    def capacity(self) -> int:
        return self.memory_mb * MIB

    @property
    def label(self) -> str:
        name = self.gpu_model if self.gpu_model is not None else "target_gpu_memory_mb"
        return f"{name} ({self.memory_mb} MiB)"


@dataclass(frozen=True)
class _Fix:
    """A point of the search: the settings a suggestion would change."""

    precision: Precision
    sharding: Sharding
    checkpointing: bool
    micro_batch: int
    dp: int

    def no_stronger_than(self, other: _Fix, base: Setup) -> bool:
        """Every change of ``self`` is also made, at least as strongly, by ``other``."""
        return (
            (self.precision == base.precision or other.precision == self.precision)
            and SHARDING_LEVEL[self.sharding] <= SHARDING_LEVEL[other.sharding]
            and (self.checkpointing == base.checkpointing or other.checkpointing)
            and self.micro_batch >= other.micro_batch
            and self.dp <= other.dp
        )


# --------------------------------------------------------------------------- search


def _micro_batches(setup: Setup) -> list[int]:
    """The requested micro-batch, then smaller ones that keep ``micro * accumulation``."""
    per_replica = setup.micro_batch * setup.gradient_accumulation
    smaller = [m for m in range(setup.micro_batch - 1, 0, -1) if per_replica % m == 0]
    return [setup.micro_batch, *smaller]


def _with_micro_batch(setup: Setup, micro_batch: int) -> Setup:
    per_replica = setup.micro_batch * setup.gradient_accumulation
    return replace(setup, micro_batch=micro_batch, gradient_accumulation=per_replica // micro_batch)


def min_data_parallel(setup: Setup, capacity: int, *, start: int = 1) -> int | None:
    """Smallest data-parallel degree >= ``start`` at which ``setup`` fits, or None.

    From d = 2 on the per-GPU total is non-increasing in d (only sharded states depend on
    it), so the search is binary.
    """
    if start == 1 and memory(replace(setup, dp=1)).total <= capacity:
        return 1
    if setup.sharding == "none":
        return None  # nothing is divided by d
    lo, hi = max(2, start), MAX_DATA_PARALLEL
    if lo > hi or memory(replace(setup, dp=hi)).total > capacity:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if memory(replace(setup, dp=mid)).total <= capacity:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _search(setup: Setup, capacity: int) -> list[_Fix]:
    """Candidate fixes (not yet verified): per precision x sharding x checkpointing, the
    largest micro-batch that fits on the requested GPUs, else the fewest GPUs that fit."""
    precisions: list[Precision] = [setup.precision]
    if setup.precision == "fp32":
        precisions.append("mixed")
    level = SHARDING_LEVEL[setup.sharding]
    shardings = [s for s in _SHARDINGS if SHARDING_LEVEL[s] >= level]
    checkpointing = [setup.checkpointing] if setup.checkpointing else [False, True]
    micro_batches = _micro_batches(setup)
    fixes: list[_Fix] = []
    for precision, sharding, ckpt in itertools.product(precisions, shardings, checkpointing):
        base = replace(setup, precision=precision, sharding=sharding, checkpointing=ckpt)
        # Sharding over a single rank saves nothing: only with more ranks, below.
        if setup.dp > 1 or sharding == setup.sharding:
            micro = next(
                (m for m in micro_batches if memory(_with_micro_batch(base, m)).total <= capacity),
                None,
            )
            if micro is not None:
                fixes.append(_Fix(precision, sharding, ckpt, micro, setup.dp))
                if micro == setup.micro_batch:
                    continue  # fits on the requested GPUs as it is: more would not be cheaper
        if sharding != "none":
            dp = min_data_parallel(base, capacity, start=setup.dp + 1)
            if dp is not None:
                fixes.append(_Fix(precision, sharding, ckpt, setup.micro_batch, dp))
    return fixes


def _strongest(setup: Setup) -> _Fix:
    """Every change at once on the requested GPUs: what is left when nothing fits."""
    return _Fix(
        precision="mixed" if setup.precision == "fp32" else setup.precision,
        sharding="zero3" if setup.dp > 1 else setup.sharding,
        checkpointing=True,
        micro_batch=_micro_batches(setup)[-1],
        dp=setup.dp,
    )


# --------------------------------------------------------------------------- verification


def _changes(setup: Setup, fix: _Fix) -> dict[str, str | int | bool]:
    changes: dict[str, str | int | bool] = {}
    if fix.precision != setup.precision:
        changes["precision"] = fix.precision
    if fix.sharding != setup.sharding:
        changes["sharding"] = fix.sharding
    if fix.checkpointing != setup.checkpointing:
        changes["checkpointing"] = fix.checkpointing
    if fix.micro_batch != setup.micro_batch:
        per_replica = setup.micro_batch * setup.gradient_accumulation
        changes["micro_batch"] = fix.micro_batch
        changes["gradient_accumulation"] = per_replica // fix.micro_batch
    if fix.dp != setup.dp:
        changes["data_parallel"] = fix.dp
        accumulated = setup.gradient_accumulation * setup.dp
        if accumulated % fix.dp == 0:  # keep the global batch where the accumulation allows
            changes["gradient_accumulation"] = accumulated // fix.dp
    return changes


def apply_changes(
    request: EstimateRequest, changes: dict[str, str | int | bool]
) -> EstimateRequest:
    """``request`` with ``changes`` applied, validated again like a new request."""
    data = request.model_dump(exclude_unset=True)
    data.pop("gpu_count", None)  # the data-parallel degree is stated instead
    data["data_parallel"] = request.data_parallel
    data.update(changes)
    return EstimateRequest.model_validate(data)


def _describe(setup: Setup, changed: Setup) -> str:
    words: list[str] = []
    if changed.precision != setup.precision:
        words.append("mixed precision (16-bit compute, fp32 master weights)")
    if changed.sharding != setup.sharding:
        words.append(
            f"sharding={changed.sharding}: shard {_SHARDED_WHAT[changed.sharding]} over the "
            f"{changed.dp} data-parallel ranks"
        )
    if changed.checkpointing != setup.checkpointing:
        words.append("full activation checkpointing (about 33% more compute)")
    if changed.micro_batch != setup.micro_batch:
        words.append(
            f"micro_batch {setup.micro_batch} -> {changed.micro_batch} with "
            f"gradient_accumulation {setup.gradient_accumulation} -> "
            f"{changed.gradient_accumulation} (global batch {setup.global_batch} unchanged)"
        )
    if changed.dp != setup.dp:
        if changed.global_batch == setup.global_batch:
            batch = f"global batch {setup.global_batch} unchanged"
            if changed.gradient_accumulation != setup.gradient_accumulation:
                batch += (
                    f" with gradient_accumulation {setup.gradient_accumulation} -> "
                    f"{changed.gradient_accumulation}"
                )
        else:
            batch = f"global batch {setup.global_batch} -> {changed.global_batch}"
        words.append(
            f"data_parallel {setup.dp} -> {changed.dp} ({changed.gpu_count} GPUs; {batch})"
        )
    return "; ".join(words)


def _kind(changes: dict[str, str | int | bool]) -> SuggestionKind:
    dimensions = set(changes) - {"gradient_accumulation"}
    if len(dimensions) == 1:
        (only,) = dimensions
        kinds: dict[str, SuggestionKind] = {
            "precision": "precision",
            "sharding": "sharding",
            "checkpointing": "checkpointing",
            "micro_batch": "micro_batch",
            "data_parallel": "data_parallel",
        }
        return kinds[only]
    return "combined"


def _verify(original: Evaluation, fix: _Fix, target: Target) -> Suggestion | None:
    """Re-estimate the request with ``fix`` applied and judge it against ``target``; None
    when the changed request is not a valid one (an accumulation past its bound)."""
    changes = _changes(original.setup, fix)
    try:
        changed = apply_changes(original.request, changes)
    except ValidationError:
        return None
    again = evaluate(changed)
    total = again.memory.total
    fits = total <= target.capacity
    known = {w.code for w in original.warnings}
    new_warnings = [w.text for w in again.warnings if w.code not in known]
    gpus = again.setup.gpu_count
    if fits:
        message = f"fits {target.label} at {total / GIB:.2f} GiB per GPU on {gpus} GPU(s)"
    else:
        message = (
            f"still does not fit {target.label}: {total / GIB:.2f} GiB per GPU on {gpus} "
            "GPU(s) with every checked change; only more tensor_parallel or "
            "pipeline_parallel is left (not estimated here)"
        )
    if new_warnings:
        message += " (with a warning the request does not have)"
    return Suggestion(
        kind=_kind(changes),
        description=_describe(original.setup, again.setup),
        changes=changes,
        per_gpu_bytes=again.memory.breakdown(),
        total_bytes=total,
        fits=fits,
        target_bytes=target.capacity,
        gpu_model=target.gpu_model,
        gpu_count=gpus,
        warnings=new_warnings,
        message=message,
    )


def _cost(setup: Setup, suggestion: Suggestion, fix: _Fix) -> tuple[int, ...]:
    penalty = (
        PENALTY_PRECISION * (fix.precision != setup.precision)
        + PENALTY_PER_ZERO_STAGE * (SHARDING_LEVEL[fix.sharding] - SHARDING_LEVEL[setup.sharding])
        + PENALTY_CHECKPOINTING * (fix.checkpointing != setup.checkpointing)
        + PENALTY_MICRO_BATCH * (fix.micro_batch != setup.micro_batch)
    )
    return (bool(suggestion.warnings), suggestion.gpu_count, penalty, -fix.micro_batch)


def suggestions(original: Evaluation, target: Target) -> list[Suggestion]:
    """Verified changes that make ``original`` fit ``target``, cheapest first.

    Only fixes that fit when re-estimated are listed, none that makes every change of
    another listed one and more, and fixes on more GPUs only when none fits on the
    requested ones.  When none fits, the single suggestion is every change at
    once on the requested GPUs, marked as not fitting (nothing when there is none to make).
    """
    setup = original.setup
    verified = [
        (suggestion, fix)
        for fix in dict.fromkeys(_search(setup, target.capacity))
        if (suggestion := _verify(original, fix, target)) is not None
    ]
    fitting = [(s, fix) for s, fix in verified if s.fits]
    if not fitting:
        strongest = _strongest(setup)
        last_resort = _verify(original, strongest, target) if _changes(setup, strongest) else None
        return [] if last_resort is None else [last_resort]
    # More GPUs are offered only when none of the fixes on the requested ones fits.
    fitting = [(s, fix) for s, fix in fitting if fix.dp == setup.dp] or fitting
    minimal = [
        (s, fix)
        for s, fix in fitting
        if not any(other != fix and other.no_stronger_than(fix, setup) for _, other in fitting)
    ]
    minimal.sort(key=lambda pair: _cost(setup, *pair))
    return [s for s, _ in minimal]


# --------------------------------------------------------------------------- fits


def fit(
    original: Evaluation,
    name: str,
    gpu: GpuModelSpec,
    *,
    advice: list[Suggestion],
) -> GpuFit:
    """Whether the request fits ``gpu`` as asked, and from how many data-parallel GPUs;
    ``advice`` is :func:`suggestions` for this GPU (empty when it fits as asked)."""
    setup = original.setup
    target = Target(name, gpu.memory_mb)
    dp = min_data_parallel(setup, target.capacity)
    requested_total = original.memory.total

    def time_on(gpu_count: int) -> TrainingTime | None:
        request = original.request
        if request.tokens is None:
            return None
        return training_time(
            setup.parameters,
            request.tokens,
            gpu=gpu,
            gpu_count=gpu_count,
            precision=setup.precision,
            mfu=request.mfu,
        )

    if dp is None:
        if setup.sharding == "none":
            why = "with sharding=none more data-parallel GPUs do not reduce per-GPU memory"
        else:
            why = f"even with sharding={setup.sharding} the unsharded part is too large"
        message = f"does not fit {target.label} at any data-parallel degree ({why})"
        fitting = [s for s in advice if s.fits]
        if fitting:
            message += f"; cheapest verified fix: {fitting[0].description} ({fitting[0].message})"
        elif advice:
            message += f"; {advice[0].message}"
        return GpuFit(
            gpu_model=name,
            memory_mb=gpu.memory_mb,
            fits_as_requested=requested_total <= target.capacity,
            total_bytes_as_requested=requested_total,
            min_gpu_count=None,
            min_data_parallel=None,
            total_bytes_at_min=None,
            message=message,
            training_time=time_on(setup.gpu_count),
        )
    min_count = setup.tp * setup.pp * dp
    total_at_min = memory(replace(setup, dp=dp)).total
    message = (
        f"fits {target.label} from {min_count} GPUs (tensor_parallel={setup.tp} * "
        f"pipeline_parallel={setup.pp} * data_parallel={dp}) at "
        f"{total_at_min / GIB:.2f} GiB per GPU"
    )
    if dp != setup.dp:
        message += "; the global batch scales with data_parallel"
    return GpuFit(
        gpu_model=name,
        memory_mb=gpu.memory_mb,
        fits_as_requested=requested_total <= target.capacity,
        total_bytes_as_requested=requested_total,
        min_gpu_count=min_count,
        min_data_parallel=dp,
        total_bytes_at_min=total_at_min,
        message=message,
        training_time=time_on(setup.gpu_count),
        training_time_at_min=time_on(min_count),
    )
