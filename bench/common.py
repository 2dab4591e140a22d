"""Helpers the benchmarks share: their arguments, settings, statistics and result files.
The stack they start is the tests' (tests/support/stack.py).

A benchmark runs as a script (`python bench/NAME.py`): it puts the repository root on
sys.path before importing this module.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from tests.support.servers import PG_DURABLE_ENV

ROOT = Path(__file__).resolve().parents[1]


def durable_postgres() -> None:
    """Have the private PostgreSQL this benchmark starts (the tests', tests/support/
    servers.py) flush each commit to disk, as a deployment's does: the tests' server does
    not, which flatters every write. Called first by each benchmark's main, not on import:
    tests import benchmarks' modules. A server named by GPUSCHED_TEST_PG_URL is used as
    it is configured."""
    os.environ[PG_DURABLE_ENV] = "1"


# -- benchmark helpers ------------------------------------------------------------


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (pct in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-pct * len(ordered) // 100))))
    return ordered[rank - 1]


def write_results(name: str, data: dict[str, Any], *, variant: str | None = None) -> Path:
    """bench/results/<name>-<variant, else db>.json (the latest run; the run's time is
    inside)."""
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **data}
    path = out_dir / f"{name}-{variant or data.get('db', 'db')}.json"
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


def bench_env() -> dict[str, str]:
    """Benchmarks run with the settings of `gpusched up` (a laptop demo), not the test
    settings: beat every 2 s (so what is measured is the event-triggered path), agents
    sampling every 2 s, a 5 s stability window."""
    return {
        "GPUSCHED_SCHEDULER_INTERVAL_S": "2",
        "GPUSCHED_SCHEDULER_STABILITY_WINDOW_S": "5",
        "GPUSCHED_SCHEDULER_RECONCILE_INTERVAL_S": "5",
        "GPUSCHED_SCHEDULER_HEARTBEAT_TIMEOUT_S": "30",
        "GPUSCHED_SCHEDULER_TELEMETRY_MAX_AGE_S": "30",
        "GPUSCHED_AGENT_SAMPLE_INTERVAL_S": "2",
    }


def summarize(values: list[float]) -> dict[str, float]:
    import statistics

    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values) if values else float("nan"),
        "mean": statistics.fmean(values) if values else float("nan"),
    }


def bench_args(description: str, **defaults: Any) -> Any:
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--db", choices=("postgresql", "sqlite"), default="postgresql")
    for key, value in defaults.items():
        flag = f"--{key.replace('_', '-')}"
        if isinstance(value, bool):
            parser.add_argument(flag, action="store_true", default=value)
        else:
            parser.add_argument(flag, type=type(value), default=value)
    parser.add_argument("--keep", action="store_true", help="keep the stack's directory")
    return parser.parse_args()


def print_table(rows: list[tuple[str, str]], title: str) -> None:
    width = max(len(k) for k, _ in rows)
    print(f"\n{title}\n" + "-" * (width + 24))
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print()


def reference_loop_ms() -> float:
    """How fast this machine runs Python now: the best of three runs of one fixed loop. A
    shared or throttled machine's speed moves by half and more within an hour; a figure
    measured beside this one can be read against it."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        sum(range(2_000_000))
        best = min(best, time.perf_counter() - started)
    return best * 1000


def machine_info() -> dict[str, Any]:
    import platform

    from app import compiled_core

    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        # Plain Python plans about twice as slowly: after an edit of app/scheduling, until
        # `make native` builds it again.
        "core": "compiled" if compiled_core.in_use() else "plain Python",
        "reference_loop_ms": round(reference_loop_ms(), 1),
        "private_postgresql": "durable commits (fsync, synchronous_commit on) where started here",
    }
