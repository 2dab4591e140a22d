"""Trace format (see /work/shared/traces/README.md) and its CSV reader."""

from __future__ import annotations

import csv
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

COLUMNS = ("job_id", "user", "vc", "jobname", "gpu_num", "gpu_milli", "submit_time", "duration")


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: str
    user: str
    vc: str
    jobname: str
    gpu_num: int
    gpu_milli: int
    submit_time: float
    duration: float
    # Not in trace files: set by `mark_offpeak` to submit the job with schedule mode
    # "offpeak" (it waits for an off-peak window).
    offpeak: bool = False


def read_trace(path: Path | str) -> list[TraceJob]:
    """Read a trace CSV; rows are returned sorted by submit time (stable)."""
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing columns {', '.join(missing)}")
        jobs = [
            TraceJob(
                job_id=row["job_id"],
                user=row["user"],
                vc=row["vc"],
                jobname=row["jobname"],
                gpu_num=int(row["gpu_num"]),
                gpu_milli=int(row["gpu_milli"] or 1000),
                submit_time=float(row["submit_time"]),
                duration=float(row["duration"]),
            )
            for row in reader
        ]
    jobs.sort(key=lambda j: j.submit_time)
    return jobs


def mark_offpeak(jobs: Sequence[TraceJob], *, fraction: float, seed: int) -> list[TraceJob]:
    """The same jobs, a seeded random `fraction` of them (rounded) marked off-peak.

    Traces record no schedule mode, so which jobs a user would have sent off-peak
    is drawn at random; the same seed marks the same jobs, so runs with and
    without windows or tariffs compare the same workload.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError("off-peak fraction must be within 0..1")
    chosen = set(random.Random(seed).sample(range(len(jobs)), round(fraction * len(jobs))))
    return [replace(j, offpeak=True) if i in chosen else j for i, j in enumerate(jobs)]
