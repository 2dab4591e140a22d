"""Trace format (see /work/shared/traces/README.md) and its CSV reader."""

from __future__ import annotations

import csv
from dataclasses import dataclass
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
