"""Plain function behind `gpusched simulate` (the typer command lives elsewhere)."""

from __future__ import annotations

import json
from pathlib import Path

from app.scheduling import QUEUE_POLICIES
from app.simulator.engine import SimResult, simulate
from app.simulator.trace import read_trace


def _hours(s: float) -> str:
    return f"{s / 3600:,.1f}"


def format_table(results: list[SimResult]) -> str:
    """A fixed-width table, times in hours, with the lower bounds as the last row."""
    head = (
        f"{'policy':<11} {'jobs':>6} {'skip':>5} {'avg JCT h':>10} {'p50 JCT h':>10} "
        f"{'p99 JCT h':>10} {'avg queue h':>11} {'makespan h':>11} {'util':>6} {'preempt':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r.policy:<11} {r.jobs:>6} {r.skipped:>5} {_hours(r.avg_jct_s):>10} "
            f"{_hours(r.p50_jct_s):>10} {_hours(r.p99_jct_s):>10} {_hours(r.avg_queue_s):>11} "
            f"{_hours(r.makespan_s):>11} {r.utilization:>6.1%} {r.preemptions:>8}"
        )
    if results:
        lb = results[0].lower_bounds
        util_bound = min(1.0, results[0].utilization * results[0].makespan_s / lb["makespan_s"])
        lines.append(
            f"{'lower bound':<11} {'':>6} {'':>5} {_hours(lb['avg_jct_s']):>10} {'':>10} "
            f"{'':>10} {'0.0':>11} {_hours(lb['makespan_s']):>11} {util_bound:>6.1%} {'':>8}"
        )
    return "\n".join(lines)


def run_simulation_cli(
    trace: Path,
    nodes: int,
    gpus_per_node: int,
    policy: str | None,
    time_scale: float,
    as_json: bool,
) -> str:
    """Run one policy (or all when `policy` is None) and return the text to print."""
    if nodes <= 0 or gpus_per_node <= 0:
        raise ValueError("nodes and gpus-per-node must be positive")
    policies = list(QUEUE_POLICIES) if policy is None else [policy]
    for p in policies:
        if p not in QUEUE_POLICIES:
            raise ValueError(f"unknown policy {p!r}; choose from {', '.join(QUEUE_POLICIES)}")
    jobs = read_trace(trace)
    results = [
        simulate(jobs, nodes=nodes, gpus_per_node=gpus_per_node, policy=p, time_scale=time_scale)
        for p in policies
    ]
    if as_json:
        payload = results[0].to_json() if len(results) == 1 else [r.to_json() for r in results]
        return json.dumps(payload, indent=2)
    title = f"trace {trace.name}: {nodes} nodes x {gpus_per_node} GPUs, time scale {time_scale:g}"
    return title + "\n" + format_table(results)
