"""The default policy's knobs against the goal of issue 41: avg JCT against p99 JCT.

    .venv/bin/python bench/default_frontier.py [--only philly_0e4a51.csv ...]
        [--factors 0 0.25 1] [--promote 0 4] [--fractions 1 0.5 0] [--jobs 2]
        [--set promoted_may_preempt=1 --set preempt_remaining_cost=0 ...]

For every trace and shape of `scheduling_quality.py --goal` (each charged the same
preemption cost), runs fifo, sjf and las once, then the default with each pair of
knobs (`short_first_factor` x `promote_after_service`) and prints, per pair, how
many of the goal's checks hold, the geometric mean of avg JCT over the best of
fifo/sjf/las, the worst such ratio, and the geometric mean of p99 over fifo's: the
frontier from which docs/scheduling.md chooses the default's knobs. With `--set`, each
`--set KEY=VALUE[,KEY=VALUE]` is one row instead: those PolicySettings fields changed
from the defaults (booleans as 0/1), e.g. the preemption-cost knobs. Tune on some
traces (`--only`) and check the choice on the others. Writes
bench/results/default_frontier.md (`--out` to change).
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.scheduling import PolicySettings  # noqa: E402
from app.simulator import DEFAULT_PREEMPTION_COST_S, mark_preemptible, read_trace, simulate  # noqa: E402
from bench.scheduling_quality import (  # noqa: E402
    GOAL_FRACTIONS,
    GOAL_REFERENCES,
    goal_shapes,
    trace_files,
    verdict,
)

# avg JCT, p99 JCT, utilisation, makespan, preemptions
Metrics = tuple[float, float, float, float, float]


Knobs = tuple[tuple[str, float], ...]  # PolicySettings fields changed, as (name, value)


def _run(args: tuple[Path, int, int, float, str, Knobs, float]) -> Metrics:
    path, nodes, shape_i, fraction, policy, knobs, cost = args
    jobs = read_trace(path)
    shape = goal_shapes(jobs, nodes)[shape_i]
    marked = mark_preemptible(jobs, fraction=fraction, seed=0)
    defaults = PolicySettings()
    changed = {k: type(getattr(defaults, k))(v) for k, v in knobs}
    settings = replace(defaults, **changed)
    r = simulate(
        marked,
        nodes=shape.nodes,
        gpus_per_node=8,
        policy=policy,
        time_scale=shape.time_scale,
        settings=settings,
        preemption_cost_s=cost,
    )
    return r.avg_jct_s, r.p99_jct_s, r.utilization, r.makespan_s, float(r.preemptions)


class _R:
    """Just what `verdict` reads of a SimResult."""

    def __init__(self, m: Metrics) -> None:
        self.avg_jct_s, self.p99_jct_s, self.utilization, self.makespan_s, _ = m


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--traces-dir", type=Path, default=ROOT / ".." / "shared" / "traces")
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--factors", nargs="+", type=float, default=[0.0, 0.25, 1.0])
    ap.add_argument("--promote", nargs="+", type=float, default=[0.0, 4.0])
    ap.add_argument("--fractions", nargs="+", type=float, default=list(GOAL_FRACTIONS))
    ap.add_argument("--preemption-cost", type=float, default=DEFAULT_PREEMPTION_COST_S)
    ap.add_argument("--jobs", type=int, default=2, help="replays in parallel")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "default_frontier.md")
    args = ap.parse_args(argv)
    files = trace_files(args.traces_dir, args.only)
    knobs: list[Knobs] = [
        (("short_first_factor", f), ("promote_after_service", p))
        for f, p in itertools.product(args.factors, args.promote)
    ]
    if args.set:
        knobs = [
            tuple((k, float(v)) for k, v in (kv.split("=", 1) for kv in row.split(",") if kv))
            for row in args.set
        ]
    cases = []
    for f in files:
        for i, _ in enumerate(goal_shapes(read_trace(f), args.nodes)):
            for frac in args.fractions:
                cases.append((f, i, frac))
    tasks: list[tuple[Path, int, int, float, str, Knobs, float]] = []
    for f, i, frac in cases:
        for p in GOAL_REFERENCES:
            tasks.append((f, args.nodes, i, frac, p, (), args.preemption_cost))
        for knob in knobs:
            tasks.append((f, args.nodes, i, frac, "default", knob, args.preemption_cost))
    with ProcessPoolExecutor(args.jobs) as pool:
        got = dict(zip(tasks, pool.map(_run, tasks), strict=True))
    lines = [
        f"Traces: {', '.join(f.stem for f in files)}; fractions preemptible "
        f"{', '.join(f'{x:g}' for x in args.fractions)}; {args.preemption_cost:g} s per "
        "preemption. Per pair of knobs: goal checks held, geometric mean and worst of "
        "default avg JCT / best of fifo, sjf, las, and geometric mean of default p99 / "
        "fifo p99.",
        "",
        "| knobs | checks | avg / best (geo) | avg / best (worst) | p99 / fifo p99 (geo) "
        "| preemptions |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    detail = [
        "",
        "| trace | shape | preemptible | knobs | avg / best | p99 / fifo | makespan / fifo "
        "| fails |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | --- |",
    ]
    for knob in knobs:
        label = ", ".join(f"{k}={v:g}" for k, v in knob) or "defaults"
        held = total = 0
        preempted = 0
        ratios: list[float] = []
        tails: list[float] = []
        for f, i, frac in cases:
            res = {
                p: _R(got[(f, args.nodes, i, frac, p, (), args.preemption_cost)])
                for p in GOAL_REFERENCES
            }
            mine = got[(f, args.nodes, i, frac, "default", knob, args.preemption_cost)]
            res["default"] = _R(mine)
            preempted += int(mine[4])
            v = verdict(res)  # type: ignore[arg-type]
            held += sum(v.holds)
            total += 3
            ratios.append(v.avg_ratio)
            tails.append(v.p99_vs_fifo)
            detail.append(
                f"| {f.stem} | {i} | {frac:.0%} | {label} | {v.avg_ratio:.2f} "
                f"| {v.p99_vs_fifo:.2f} | {v.makespan_ratio:.3f} "
                f"| {''.join(c for c, ok in zip('abc', v.holds, strict=True) if not ok)} |"
            )
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        tail = math.exp(sum(map(math.log, tails)) / len(tails))
        lines.append(
            f"| {label} | {held} / {total} | {geo:.3f} | {max(ratios):.2f} | {tail:.3f} "
            f"| {preempted} |"
        )
        print(lines[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines + detail) + "\n")


if __name__ == "__main__":
    main()
