"""Trace format (see /work/shared/traces/README.md), its CSV reader, and the seeded
draws that mark which of a trace's jobs go off-peak and which may be preempted."""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _csv import Reader as _CsvReader

COLUMNS = ("job_id", "user", "vc", "jobname", "gpu_num", "gpu_milli", "submit_time", "duration")


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, line and field."""


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
    # Not in trace files either (the format has no such flag): `mark_preemptible` clears
    # it for the jobs that must never be preempted.
    preemptible: bool = True


def _whole(field: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{field}: {text!r} is not a whole number") from None


def _seconds(field: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{field}: {text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{field}: {text} must be a finite number of seconds >= 0")
    return value


def _job(values: dict[str, str]) -> TraceJob:
    """One row's job; a ValueError names the field and the reason."""
    for name in COLUMNS:
        if not values[name].strip():
            raise ValueError(f"{name}: missing (the field is empty)")
    gpu_num = _whole("gpu_num", values["gpu_num"])
    if gpu_num < 1:
        raise ValueError(f"gpu_num: {gpu_num}: a job needs at least 1 GPU")
    gpu_milli = _whole("gpu_milli", values["gpu_milli"])
    if not 1 <= gpu_milli <= 1000:
        raise ValueError(f"gpu_milli: {gpu_milli} is outside 1..1000 (1000 = a whole GPU)")
    if gpu_milli < 1000 and gpu_num > 1:
        # As the API (a share is of one GPU); silently rounding up would change the load.
        raise ValueError(
            f"gpu_milli: {gpu_milli} (a share of a GPU) needs gpu_num 1, not {gpu_num}"
        )
    return TraceJob(
        job_id=values["job_id"],
        user=values["user"],
        vc=values["vc"],
        jobname=values["jobname"],
        gpu_num=gpu_num,
        gpu_milli=gpu_milli,
        submit_time=_seconds("submit_time", values["submit_time"]),
        duration=_seconds("duration", values["duration"]),
    )


def read_trace(path: Path | str) -> list[TraceJob]:
    """Read a trace CSV; rows are returned sorted by submit time (stable).

    A bad row stops the reading with a TraceError naming the file, the line (where
    the row starts) and the field: a row with too few or too many fields, an empty
    field, a count or share that is not a whole number in range (gpu_num >= 1,
    gpu_milli 1..1000, a share only for a single GPU), a submit time or duration that
    is negative or not a finite number, and a job id seen before. Blank lines are
    skipped.
    """
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            try:
                jobs = _rows(reader, f"trace {path}")
            except csv.Error as exc:
                raise TraceError(f"trace {path}, line {reader.line_num}: {exc}") from None
            except UnicodeDecodeError:
                raise TraceError(
                    f"trace {path}, after line {reader.line_num}: not UTF-8 text"
                ) from None
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}") from None
    jobs.sort(key=lambda j: j.submit_time)
    return jobs


def _rows(reader: _CsvReader, name: str) -> list[TraceJob]:
    header = [column.strip() for column in next(reader, [])]
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise TraceError(f"{name}: missing columns {', '.join(missing)}")
    jobs: list[TraceJob] = []
    first_line: dict[str, int] = {}
    end = reader.line_num
    for row in reader:
        # A quoted field may hold line breaks: the row starts after the previous one.
        line, end = end + 1, reader.line_num
        if not row:
            continue
        where = f"{name}, line {line}"
        if len(row) != len(header):
            raise TraceError(f"{where}: {len(row)} fields where the header has {len(header)}")
        try:
            job = _job(dict(zip(header, row, strict=True)))
        except ValueError as exc:
            raise TraceError(f"{where}: {exc}") from None
        if job.job_id in first_line:
            raise TraceError(
                f"{where}: job_id: {job.job_id!r} repeats line {first_line[job.job_id]}"
            )
        first_line[job.job_id] = line
        jobs.append(job)
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


def mark_preemptible(jobs: Sequence[TraceJob], *, fraction: float, seed: int) -> list[TraceJob]:
    """The same jobs, only a seeded random `fraction` of them (rounded) preemptible.

    Traces record no such flag, so it is drawn, as off-peak is: the jobs come in a
    seeded random order and the first `fraction` of that order may be preempted, so the
    preemptible jobs at 0.5 are among those at 0.7 for the same seed. The draw has its
    own random stream (not the off-peak draw's), and 1 keeps every job preemptible, the
    simulator's behaviour before the option existed.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError("preemptible fraction must be within 0..1")
    order = list(range(len(jobs)))
    random.Random(f"preemptible/{seed}").shuffle(order)
    chosen = set(order[: round(fraction * len(jobs))])
    return [j if i in chosen else replace(j, preemptible=False) for i, j in enumerate(jobs)]
