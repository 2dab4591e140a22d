"""What starting one attempt costs the node: `start_job` of `true`, one after another.

    .venv/bin/python bench/job_start.py [--starts 100] [--fresh]

Each start goes through the agent's real path (workers/agent/runner.py): the attempt's
fence (the strongest this host has: a cgroup v2 or v1 group, else a subreaper), its
supervisor (forked by the node's fork server, or `--fresh`: a fresh interpreter each), the
job's program, its outcome. Reported per start: the time until `start_job` returns (the
supervisor says the program runs), until the outcome is known, the CPU the supervisors and
the job used (this process's reaped children, the fork server and what it reaped
included) and this process's own (the agent's part). No database, broker or scheduler:
in a drain these figures come on top of theirs.
Prints a table; writes bench/results/job_start-<fence>.json
(e.g. job_start-cgroup-v1.json).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine_info, print_table, reference_loop_ms, summarize, write_results
from workers.agent import forkserver
from workers.agent.fence import choose_fence
from workers.agent.runner import JobLaunch, start_job, stop_groups


def cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=100)
    parser.add_argument(
        "--fresh", action="store_true", help="no fork server: a fresh interpreter per start"
    )
    args = parser.parse_args()
    fence = choose_fence(f"bench{os.getpid()}", "n1")
    if args.fresh:
        forkserver.fork_server(fence.installation, fence.node).unusable = "--fresh"
    to_running: list[float] = []
    to_outcome: list[float] = []
    children_before, own_before = cpu_s(resource.RUSAGE_CHILDREN), cpu_s(resource.RUSAGE_SELF)
    with tempfile.TemporaryDirectory() as work:
        for attempt in range(1, args.starts + 1):
            spec = JobLaunch(
                command=["true"],
                workdir=work,
                job_id=1,
                attempt=attempt,
                log_path=Path(work) / f"attempt-{attempt}.log",
                grace_s=1.0,
            )
            started = time.perf_counter()
            running = start_job(spec, fence=fence)
            to_running.append((time.perf_counter() - started) * 1000)
            outcome = running.wait(30)
            to_outcome.append((time.perf_counter() - started) * 1000)
            if outcome is None or outcome.exit_code != 0:
                raise SystemExit(f"attempt {attempt} did not end as `true` does: {outcome}")
    own_ms = (cpu_s(resource.RUSAGE_SELF) - own_before) * 1000 / args.starts
    forkserver.stop_all()  # reaped now: its CPU and its supervisors' join our children's
    cpu_ms = (cpu_s(resource.RUSAGE_CHILDREN) - children_before) * 1000 / args.starts
    stop_groups([(group, 0.0) for group in fence.find()])
    for group in fence.find():
        group.remove()
    running_ms, outcome_ms = summarize(to_running), summarize(to_outcome)
    print_table(
        [
            ("fence", fence.isolation),
            ("starts", str(args.starts)),
            ("to running, p50 / p90 / max ms", _three(running_ms)),
            ("to outcome, p50 / p90 / max ms", _three(outcome_ms)),
            ("supervisor + job CPU per start", f"{cpu_ms:.1f} ms"),
            ("the agent's own CPU per start", f"{own_ms:.1f} ms"),
            ("reference loop", f"{reference_loop_ms():.1f} ms"),
        ],
        "starting one attempt (`true`), one after another",
    )
    path = write_results(
        "job_start",
        {
            "fence": fence.isolation,
            "starts": args.starts,
            "to_running_ms": running_ms,
            "to_outcome_ms": outcome_ms,
            "fresh_interpreters": args.fresh,
            "children_cpu_ms_per_start": cpu_ms,
            "own_cpu_ms_per_start": own_ms,
            "machine": machine_info(),
        },
        variant=fence.isolation.replace(" ", "-"),
    )
    print(f"wrote {path}")


def _three(values: dict[str, float]) -> str:
    return f"{values['p50']:.1f} / {values['p90']:.1f} / {values['max']:.1f}"


if __name__ == "__main__":
    main()
