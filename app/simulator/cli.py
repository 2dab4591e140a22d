"""Plain function behind `gpusched simulate` (the typer command lives elsewhere)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from app.scheduling import QUEUE_POLICIES, PolicySettings
from app.simulator.energy import DEFAULT_GPU_WATTS
from app.simulator.engine import DEFAULT_PREEMPTION_COST_S, SIM_EPOCH, SimResult, simulate
from app.simulator.trace import TraceJob, mark_offpeak, mark_preemptible, read_trace
from app.windows.calendar import WindowSpec
from app.windows.schemas import WindowIn
from app.windows.tariff import Tariff, load_tariff


def _hours(s: float) -> str:
    return f"{s / 3600:,.1f}"


def _money(x: float | None) -> str:
    return "" if x is None else f"{x:,.2f}"


def format_table(results: list[SimResult]) -> str:
    """A fixed-width table, times in hours, with the lower bounds as the last rows.

    Each policy's row shows its average JCT over the bound that counts arrivals (`vs
    bound`), the GPU-hours its preemptions cost and the fragmentation its placements
    left. Energy is always shown; the cost columns only when the runs were priced by a
    tariff.
    """
    priced = any(r.cost is not None for r in results)
    head = (
        f"{'policy':<11} {'jobs':>6} {'skip':>5} {'avg JCT h':>10} {'vs bound':>8} "
        f"{'p50 JCT h':>10} {'p99 JCT h':>10} {'avg queue h':>11} {'makespan h':>11} "
        f"{'util':>6} {'frag':>6} {'preempt':>8} {'lost GPU-h':>10} {'energy kWh':>11}"
    )
    if priced:
        head += f" {'cost':>11} {'cost@peak':>11}"
    lines = [head, "-" * len(head)]
    for r in results:
        line = (
            f"{r.policy:<11} {r.jobs:>6} {r.skipped:>5} {_hours(r.avg_jct_s):>10} "
            f"{r.jct_over_bound:>7.2f}x {_hours(r.p50_jct_s):>10} {_hours(r.p99_jct_s):>10} "
            f"{_hours(r.avg_queue_s):>11} {_hours(r.makespan_s):>11} {r.utilization:>6.1%} "
            f"{r.fragmentation:>6.1%} {r.preemptions:>8} {r.preemption_lost_gpu_h:>10,.1f} "
            f"{r.energy_wh / 1000:>11,.1f}"
        )
        if priced:
            line += f" {_money(r.cost):>11} {_money(r.cost_at_peak):>11}"
        lines.append(line)
    if results:
        for label, b in zip(("lower bound", "w/ arrivals"), results[0].bound_rows(), strict=True):
            lines.append(
                f"{label:<11} {'':>6} {'':>5} {_hours(b.avg_jct_s):>10} {'':>8} {'':>10} "
                f"{'':>10} {_hours(b.avg_queue_s):>11} {_hours(b.makespan_s):>11} "
                f"{b.utilization:>6.1%}"
            )
    return "\n".join(lines)


def _error_text(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "window"
        msg = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{field}: {msg}")
    return "; ".join(parts)


def load_windows(path: Path) -> list[WindowSpec]:
    """A JSON list of window bodies, each validated exactly as `POST /windows` validates it.

    Errors are ValueErrors naming the file, the window (position and name) and the field.
    """
    try:
        data: Any = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read windows file {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"windows file {path} is not JSON: {exc}") from None
    if not isinstance(data, list) or not data:
        raise ValueError(f"windows file {path} must hold a non-empty JSON list of windows")
    specs: list[WindowSpec] = []
    for i, body in enumerate(data):
        label = f"window {i}"
        if isinstance(body, dict) and isinstance(body.get("name"), str):
            label += f" ({body['name']!r})"
        try:
            spec = WindowIn.model_validate(body).to_spec()
        except ValidationError as exc:
            raise ValueError(f"windows file {path}: {label}: {_error_text(exc)}") from None
        if any(s.name == spec.name for s in specs):
            # Names are unique in the API too (a second POST is a conflict).
            raise ValueError(f"windows file {path}: {label}: name: {spec.name!r} is repeated")
        specs.append(spec)
    return specs


def parse_start(text: str | None) -> datetime:
    """The simulated instant of trace time 0: ISO 8601 with an offset, default SIM_EPOCH."""
    if text is None:
        return SIM_EPOCH
    try:
        start = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"start {text!r} is not an ISO 8601 date-time") from None
    if start.tzinfo is None:
        raise ValueError(f"start {text!r} needs a UTC offset, e.g. {text}+00:00")
    return start


class CliOutput(NamedTuple):
    text: str  # for standard output
    notes: tuple[str, ...] = ()  # for standard error


def skipped_note(jobs: list[TraceJob], result: SimResult, nodes: int, gpus_per_node: int) -> str:
    """The jobs that can never fit the cluster, by id and size."""
    sizes = {j.job_id: j.gpu_num for j in jobs}
    listed = ", ".join(f"{i} ({sizes[i]} GPUs)" for i in result.skipped_ids)
    count = len(result.skipped_ids)
    return (
        f"skipped {count} job{'s' if count != 1 else ''} that can never fit "
        f"{nodes} x {gpus_per_node} GPUs: {listed}"
    )


def run_simulation_cli(
    trace: Path,
    nodes: int,
    gpus_per_node: int,
    policy: str | None,
    time_scale: float,
    as_json: bool,
    *,
    windows_file: Path | None = None,
    tariff_file: Path | None = None,
    offpeak_fraction: float = 0.0,
    gpu_watts: float = DEFAULT_GPU_WATTS,
    seed: int = 0,
    start: str | None = None,
    starvation_after_s: float = PolicySettings().starvation_after_s,
    exact_runtimes: bool = False,
    preemption_cost_s: float = DEFAULT_PREEMPTION_COST_S,
    preemptible_fraction: float = 1.0,
) -> CliOutput:
    """Run one policy (or all when `policy` is None): the text to print, and notes for
    standard error (the jobs skipped because they can never fit the cluster).

    `offpeak_fraction` of the trace's jobs (drawn with `seed`) wait for a window of
    `windows_file`; `tariff_file` (the GPUSCHED_TARIFF_FILE format) prices the energy.
    Only `preemptible_fraction` of the jobs (another draw with `seed`) may be preempted,
    and each preemption costs its job `preemption_cost_s` seconds of work.
    """
    if nodes <= 0 or gpus_per_node <= 0:
        raise ValueError("nodes and gpus-per-node must be positive")
    if gpu_watts < 0:
        raise ValueError("gpu-watts must be >= 0")
    policies = list(QUEUE_POLICIES) if policy is None else [policy]
    for p in policies:
        if p not in QUEUE_POLICIES:
            raise ValueError(f"unknown policy {p!r}; choose from {', '.join(QUEUE_POLICIES)}")
    epoch = parse_start(start)
    # Read the small files first: a typo there should not wait for a long trace.
    specs: Sequence[WindowSpec] = load_windows(windows_file) if windows_file else ()
    tariff: Tariff | None = load_tariff(tariff_file) if tariff_file else None
    if offpeak_fraction > 0 and not specs:
        raise ValueError("--offpeak-fraction needs --windows (off-peak jobs wait for a window)")
    jobs = mark_offpeak(read_trace(trace), fraction=offpeak_fraction, seed=seed)
    jobs = mark_preemptible(jobs, fraction=preemptible_fraction, seed=seed)
    results = [
        simulate(
            jobs,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            policy=p,
            time_scale=time_scale,
            seed=seed,
            window_specs=specs,
            tariff=tariff,
            gpu_watts=gpu_watts,
            epoch=epoch,
            settings=PolicySettings(starvation_after_s=starvation_after_s),
            exact_runtimes=exact_runtimes,
            preemption_cost_s=preemption_cost_s,
        )
        for p in policies
    ]
    notes = (skipped_note(jobs, results[0], nodes, gpus_per_node),) if results[0].skipped else ()
    if as_json:
        payload = results[0].to_json() if len(results) == 1 else [r.to_json() for r in results]
        return CliOutput(json.dumps(payload, indent=2), notes)
    title = (
        f"trace {trace.name}: {nodes} nodes x {gpus_per_node} GPUs, time scale {time_scale:g}, "
        f"preemption cost {preemption_cost_s:g} s, "
        f"{results[0].preemptible_jobs} jobs preemptible ({preemptible_fraction:.0%})"
    )
    if exact_runtimes:
        title += ", exact runtimes (clairvoyant)"
    if specs or tariff is not None:
        title += (
            f"\nstart {epoch.isoformat()}, windows {', '.join(s.name for s in specs) or 'none'}, "
            f"off-peak jobs {sum(j.offpeak for j in jobs)} ({offpeak_fraction:.0%}), "
            f"{gpu_watts:g} W per GPU"
        )
    return CliOutput(title + "\n" + format_table(results), notes)
