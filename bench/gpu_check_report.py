"""The real-GPU check's judgement: its readings (readings.json) in, the checks and report.md out.

Pure functions over the recorded readings, so a device run's readings.json can be judged
again here, with no GPU (`python bench/gpu_check.py evaluate readings.json`), and the
tests judge synthetic sessions. `bench/gpu_check.py` records the readings; the shapes it
writes are described where they are read below.

Each check compares what gpusched shows (the API, the dashboard's data, `seff`) with
what the driver reports through `nvidia-smi`, sampled alongside, within a stated error.
"""

from __future__ import annotations

import bisect
import itertools
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

PASS = "PASS"
FAIL = "FAIL"
# Fails today for a reason an open issue names; the run still counts as passing. Shown
# apart from PASS so that nobody reads it as working, and turns PASS when fixed.
KNOWN_FAIL = "KNOWN-FAIL"
# Not checked: the feature it needs is not there (device isolation before issue 32).
SKIP = "SKIP"
RESULTS = (PASS, FAIL, KNOWN_FAIL, SKIP)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_NO_GPU = 2
EXIT_SETUP = 3

# The errors stated against nvidia-smi. A telemetry row is stamped when the report is
# stored, after the agent read NVML: it is compared with the nearest nvidia-smi reading
# from ROW_LAG_S before it to ROW_LEAD_S after it.
ROW_LAG_S = 2.0
ROW_LEAD_S = 0.5
MEMORY_TOLERANCE_MB = 256  # median |difference| of memory used, MiB
UTIL_TOLERANCE_PCT = 10.0  # median |difference| of utilisation, percentage points
MIN_MATCHED_ROWS = 10
SEFF_UTIL_TOLERANCE_PCT = 10.0  # seff's mean utilisation against nvidia-smi's over the run
SEFF_MEMORY_TOLERANCE = (256, 0.03)  # seff's peak memory: MiB, or this part of the peak
SEFF_ENERGY_TOLERANCE = 0.20  # seff's energy against nvidia-smi's power integrated
# The job after the foreign process: starts no sooner than the stability window after the
# process ended (less one agent sample), and no later than this after the window.
START_EARLY_SLACK_S = 1.5
START_LATE_SLACK_S = 20.0
# `gpusched estimate` against torch.cuda.max_memory_allocated: never below (a request
# sized from it would run out of memory), at most twice.
ESTIMATE_RATIO = (1.0, 2.0)
MAX_DURATION_S = 360.0
FOREIGN_REASON = "foreign_process"


@dataclass(frozen=True)
class Check:
    name: str
    expected: str
    seen: str
    result: str


# -- readings helpers --------------------------------------------------------------------


def timestamp(value: str | float | None) -> float | None:
    """Unix seconds of an API datetime (ISO 8601, UTC when it names no zone)."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def parse_topology(text: str) -> dict[int, list[int]]:
    """NVLink peers of each GPU from `nvidia-smi topo -m`: a cell NV<n> joins two GPUs."""
    peers: dict[int, list[int]] = {}
    header: list[str] | None = None
    for line in text.splitlines():
        cells = line.split()
        if not cells:
            continue
        if header is None:
            if cells[0].startswith("GPU"):
                header = cells
            continue
        match = re.fullmatch(r"GPU(\d+)", cells[0])
        if match is None:
            continue
        row = int(match.group(1))
        peers[row] = sorted(
            int(column[3:])
            for column, cell in zip(header, cells[1:], strict=False)
            if re.fullmatch(r"GPU\d+", column) and cell.startswith("NV")
        )
    return peers


def dashboard_state(node: dict[str, Any], gpu: dict[str, Any]) -> str:
    """The overview's state of a GPU: frontend/js/pages/overview.js gpuState, in Python."""
    if not gpu.get("healthy") or node.get("state") != "READY":
        return "down"
    if (gpu.get("allocated") or 0) > 0:
        return "busy"
    if (gpu.get("foreign_util_pct") or 0) > 0 or (gpu.get("foreign_memory_mb") or 0) > 0:
        return "foreign"
    return "idle"


class SmiSeries:
    """nvidia-smi's readings of one GPU over time (`smi_samples` rows of that index)."""

    def __init__(self, samples: Iterable[dict[str, Any]], index: int) -> None:
        rows = sorted((s for s in samples if s.get("index") == index), key=lambda s: s["t"])
        self.rows = rows
        self.times = [r["t"] for r in rows]

    def near(self, t: float) -> list[dict[str, Any]]:
        lo = bisect.bisect_left(self.times, t - ROW_LAG_S)
        hi = bisect.bisect_right(self.times, t + ROW_LEAD_S)
        return self.rows[lo:hi]

    def between(self, start: float, end: float) -> list[dict[str, Any]]:
        lo = bisect.bisect_left(self.times, start)
        hi = bisect.bisect_right(self.times, end)
        return self.rows[lo:hi]


def smi_memory_used(row: dict[str, Any]) -> float | None:
    """Memory used as NVML's v1 memory info counts it (total - free), which is what the
    agent reads; nvidia-smi's own memory.used leaves the driver's reserved part out."""
    if row.get("memory_total_mb") is None or row.get("memory_free_mb") is None:
        return None
    return float(row["memory_total_mb"] - row["memory_free_mb"])


def errors_against_smi(
    rows: Iterable[tuple[float, int, float | None, str]], smi: dict[Any, SmiSeries]
) -> list[float]:
    """|ours - nvidia-smi's| for each (time, GPU index, value, which) row: the smallest
    difference to a reading in the row's window (the agent's reading time is not known
    more closely than that)."""
    found = []
    for t, index, value, which in rows:
        series = smi.get(index)
        if value is None or series is None:
            continue
        refs = [
            ref
            for r in series.near(t)
            if (ref := (smi_memory_used(r) if which == "memory" else r.get("util_pct"))) is not None
        ]
        if refs:
            found.append(min(abs(value - ref) for ref in refs))
    return found


def describe_errors(errors: Sequence[float], unit: str) -> str:
    if not errors:
        return "no row matched an nvidia-smi reading"
    ordered = sorted(errors)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return (
        f"{len(errors)} rows; |difference| median {statistics.median(errors):.1f} {unit}, "
        f"p90 {p90:.1f}, max {ordered[-1]:.1f}"
    )


def judge_errors(errors: Sequence[float], tolerance: float) -> str:
    if len(errors) < MIN_MATCHED_ROWS:
        return FAIL
    return PASS if statistics.median(errors) <= tolerance else FAIL


def trapezoid_wh(points: Sequence[tuple[float, float]]) -> float:
    """Energy in Wh of (time s, power W) readings."""
    total = 0.0
    for (t0, p0), (t1, p1) in itertools.pairwise(points):
        total += (t1 - t0) * (p0 + p1) / 2
    return total / 3600


def _fmt_gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 2**30:.2f} GiB"


# -- the checks --------------------------------------------------------------------------


def evaluate(readings: dict[str, Any]) -> list[Check]:
    """Every check of the run, in the report's order."""
    mode = readings.get("mode")
    if mode == "no-gpu":
        return [
            Check(
                "NVIDIA GPU present",
                "nvidia-smi lists at least one GPU",
                f"no NVIDIA GPU: {readings.get('reason', '')}",
                SKIP,
            )
        ]
    if mode == "setup-failed":
        return [
            Check(
                "install from the carried wheels",
                "a venv with gpusched and its runtime dependencies, offline",
                readings.get("reason", ""),
                FAIL,
            )
        ]
    if mode == "aborted":
        return [
            Check(
                "check runs to its end",
                "a report from the driver",
                readings.get("reason", ""),
                FAIL,
            )
        ]
    phases = readings.get("phases", {})
    checks = _registration(readings)
    checks += _training(readings, phases.get("train") or {})
    checks += _foreign(readings, phases.get("foreign") or {})
    checks += _attribution(readings, phases)
    checks.append(_isolation(readings, phases.get("isolation") or {}))
    checks.append(_estimate(readings, phases))
    checks += _housekeeping(readings)
    return checks


def _not_reached(phase: dict[str, Any], readings: dict[str, Any]) -> str:
    why = phase.get("error") or readings.get("error") or "not run"
    return f"not reached: {why}"


def _registration(readings: dict[str, Any]) -> list[Check]:
    node = readings.get("node")
    smi_gpus = {g["index"]: g for g in (readings.get("smi") or {}).get("gpus", [])}
    if not node:
        seen = f"no node registered: {readings.get('error') or 'unknown'}"
        return [Check("node registers through NVML", "backend nvml, every GPU", seen, FAIL)]
    ours = {g["index"]: g for g in node.get("gpus", [])}
    checks = [
        Check(
            "node registers through NVML",
            f"backend nvml, {len(smi_gpus)} GPU(s) as nvidia-smi lists",
            f"node {node.get('name')}: backend {node.get('gpu_backend')}, {len(ours)} GPU(s), "
            f"state {node.get('state')}",
            PASS
            if node.get("gpu_backend") == "nvml" and sorted(ours) == sorted(smi_gpus) and smi_gpus
            else FAIL,
        )
    ]
    topology = (readings.get("smi") or {}).get("topology")
    smi_peers = parse_topology(topology) if topology else {}

    def per_gpu(name: str, ours_of: Any, smi_of: Any, same: Any) -> Check:
        pairs = [(i, ours_of(ours[i]), smi_of(smi_gpus[i])) for i in sorted(smi_gpus) if i in ours]
        seen = "; ".join(f"GPU {i}: {a} vs nvidia-smi {b}" for i, a, b in pairs) or "no GPU"
        ok = bool(pairs) and len(pairs) == len(smi_gpus) and all(same(a, b) for _, a, b in pairs)
        return Check(
            f"node registers: {name}", f"{name} as nvidia-smi reports", seen, PASS if ok else FAIL
        )

    checks.append(per_gpu("model", lambda g: g["model"], lambda s: s["name"], lambda a, b: a == b))
    checks.append(
        per_gpu(
            "memory (MiB)",
            lambda g: g["memory_total_mb"],
            lambda s: s["memory_total_mb"],
            lambda a, b: abs(a - b) <= 1,
        )
    )
    checks.append(per_gpu("UUID", lambda g: g["uuid"], lambda s: s["uuid"], lambda a, b: a == b))
    checks.append(
        per_gpu(
            "NVLink peers (topology)",
            lambda g: sorted(g.get("nvlink_peers") or []),
            lambda s: smi_peers.get(s["index"], []),
            lambda a, b: a == b,
        )
    )
    return checks


# What telemetry is compared with nvidia-smi on: (name, which, unit, tolerance, field).
COMPARED = (
    ("memory used", "memory", "MiB", MEMORY_TOLERANCE_MB, "memory_used_mb"),
    ("utilisation", "util", "points", UTIL_TOLERANCE_PCT, "util_pct"),
)
SOURCES = ("job page telemetry", "live node readings")
TRAINING_CHECKS = [
    "training job runs (submit --gpus 1)",
    *(f"{source}: {c[0]}" for source in SOURCES for c in COMPARED),
    "seff: mean utilisation",
    "seff: peak memory",
    "seff: energy",
]


def _against_smi(
    source: str, what: str, rows: list[tuple[float | None, int, dict[str, Any]]], smi: Any
) -> list[Check]:
    """One check per COMPARED reading of `rows` (time, GPU index, reading)."""
    checks = []
    for name, which, unit, tolerance, field in COMPARED:
        errors = errors_against_smi(
            [(t, index, row.get(field), which) for t, index, row in rows if t is not None], smi
        )
        checks.append(
            Check(
                f"{source}: {name}",
                f"median |difference| <= {tolerance:g} {unit} against nvidia-smi"
                f" (>= {MIN_MATCHED_ROWS} rows)",
                f"{what}; " + describe_errors(errors, unit),
                judge_errors(errors, tolerance),
            )
        )
    return checks


def _training(readings: dict[str, Any], train: dict[str, Any]) -> list[Check]:
    job = train.get("job") or {}
    result = train.get("result") or {}
    if not job:
        return [Check(n, "", _not_reached(train, readings), FAIL) for n in TRAINING_CHECKS]
    status = job.get("status")
    ran = status == "SUCCEEDED" and bool(result)
    checks = [
        Check(
            TRAINING_CHECKS[0],
            "SUCCEEDED, with PyTorch's result line in its log",
            f"job {job.get('id')} {status}, "
            + (
                "no result line in its log"
                if not result
                else "a CPU stand-in's result (rehearsal)"
                if result.get("fake")
                else f"{result.get('steps')} steps in {result.get('seconds')} s on "
                f"{result.get('device')} (CUDA_VISIBLE_DEVICES={result.get('cuda_visible_devices')})"
            ),
            PASS if ran and not result.get("fake") else FAIL,
        )
    ]
    samples = readings.get("smi_samples", [])
    smi = {i: SmiSeries(samples, i) for i in {s.get("index") for s in samples}}
    points = train.get("telemetry") or []
    checks += _against_smi(
        SOURCES[0],
        f"{len(points)} points",
        [(timestamp(p["at"]), p["gpu_index"], p) for p in points],
        smi,
    )
    start = timestamp(job.get("scheduled_at") or job.get("started_at"))
    end = timestamp(job.get("finished_at"))
    polls = [
        p
        for p in readings.get("polls", [])
        if start is not None and end is not None and start <= p["t"] <= end
    ]
    checks += _against_smi(
        SOURCES[1],
        f"{len(polls)} polls of /api/v1/nodes",
        [(timestamp(g.get("sampled_at")), g["index"], g) for p in polls for g in p.get("gpus", [])],
        smi,
    )
    checks += _seff(train, smi, start, end, TRAINING_CHECKS[-3:])
    return checks


def _seff(
    train: dict[str, Any],
    smi: dict[int, SmiSeries],
    start: float | None,
    end: float | None,
    names: list[str],
) -> list[Check]:
    seff = train.get("efficiency") or {}
    job = train.get("job") or {}
    # A finished job's allocations are released (empty): seff's own rows name its GPUs.
    held = [*seff.get("per_gpu", []), *job.get("allocations", [])]
    indices = sorted({g["gpu_index"] for g in held if g.get("gpu_index") is not None})
    rows = [r for i in indices if i in smi for r in smi[i].between(start or 0, end or 0)]
    if not seff or not rows:
        seen = "no seff" if not seff else "no nvidia-smi reading during the run"
        return [Check(n, "", seen, FAIL) for n in names]
    checks = []
    smi_util = [r["util_pct"] for r in rows if r.get("util_pct") is not None]
    ours = seff.get("avg_util_pct")
    mean = statistics.fmean(smi_util) if smi_util else None
    ok = ours is not None and mean is not None and abs(ours - mean) <= SEFF_UTIL_TOLERANCE_PCT
    checks.append(
        Check(
            names[0],
            f"within {SEFF_UTIL_TOLERANCE_PCT:g} points of nvidia-smi's mean over the run",
            f"seff {ours:.1f}%, nvidia-smi {mean:.1f}% ({len(smi_util)} readings)"
            if mean is not None
            else f"seff {ours}%, no nvidia-smi utilisation",
            PASS if ok else FAIL,
        )
    )
    used = [m for r in rows if (m := smi_memory_used(r)) is not None]
    peak = max(used) if used else None
    ours_peak = seff.get("peak_memory_mb")
    allowed = max(SEFF_MEMORY_TOLERANCE[0], SEFF_MEMORY_TOLERANCE[1] * (peak or 0))
    ok = ours_peak is not None and peak is not None and abs(ours_peak - peak) <= allowed
    checks.append(
        Check(
            names[1],
            f"within max({SEFF_MEMORY_TOLERANCE[0]} MiB, {SEFF_MEMORY_TOLERANCE[1]:.0%}) of "
            "nvidia-smi's peak (total - free)",
            f"seff {ours_peak} MiB, nvidia-smi {peak:.0f} MiB" if peak is not None else "n/a",
            PASS if ok else FAIL,
        )
    )
    by_gpu = [
        trapezoid_wh(
            [
                (r["t"], r["power_w"])
                for r in smi[i].between(start or 0, end or 0)
                if r.get("power_w") is not None
            ]
        )
        for i in indices
        if i in smi
    ]
    smi_wh = sum(by_gpu)
    ours_wh = seff.get("energy_wh")
    ok = (
        ours_wh is not None
        and smi_wh > 0
        and abs(ours_wh - smi_wh) <= SEFF_ENERGY_TOLERANCE * smi_wh
    )
    checks.append(
        Check(
            names[2],
            f"within {SEFF_ENERGY_TOLERANCE:.0%} of nvidia-smi's power.draw integrated over the run",
            f"seff {ours_wh:.2f} Wh, nvidia-smi {smi_wh:.2f} Wh"
            if ours_wh is not None
            else "no energy in seff",
            PASS if ok else FAIL,
        )
    )
    return checks


def _foreign(readings: dict[str, Any], foreign: dict[str, Any]) -> list[Check]:
    names = [
        "foreign process shown (API and dashboard)",
        "job waits with the foreign-load reason",
        "job starts after the foreign process ends + stability window",
    ]
    if not foreign.get("pid") or foreign.get("stopped_at") is None:
        return [Check(n, "", _not_reached(foreign, readings), FAIL) for n in names]
    pid, began, stopped = foreign["pid"], foreign["started_at"], foreign["stopped_at"]
    threshold = (readings.get("settings") or {}).get("foreign_util_threshold_pct", 10.0)
    listed = shown = 0
    top_util = 0.0
    for poll in readings.get("polls", []):
        if not began <= poll["t"] <= stopped:
            continue
        node = {"state": poll.get("node_state")}
        for gpu in poll.get("gpus", []):
            if any(
                p.get("pid") == pid and p.get("job_id") is None for p in gpu.get("processes", [])
            ):
                listed += 1
                top_util = max(top_util, gpu.get("foreign_util_pct") or 0.0)
                shown += dashboard_state(node, gpu) == "foreign"
    checks = [
        Check(
            names[0],
            f"pid {pid} listed with no job, foreign utilisation >= {threshold:g}%, the "
            "overview counting the GPU foreign-used",
            f"listed in {listed} polls, foreign utilisation up to {top_util:.0f}%, "
            f"foreign-used on the overview in {shown}",
            PASS if listed and shown and top_util >= threshold else FAIL,
        )
    ]
    waits = [p for p in foreign.get("job_polls", []) if p["t"] <= stopped]
    reasons = sorted({str(p.get("pending_reason")) for p in waits})
    started_early = [p for p in waits if p.get("status") != "PENDING"]
    messages = sorted({p.get("pending_message") or "" for p in waits if p.get("pending_reason")})
    checks.append(
        Check(
            names[1],
            f"PENDING with reason {FOREIGN_REASON} while the process runs",
            f"{len(waits)} polls; reasons {reasons}; "
            + (f"message: {messages[-1]}" if messages else "no message")
            + (
                f"; left PENDING while it ran: {started_early[0].get('status')}"
                if started_early
                else ""
            ),
            PASS if waits and FOREIGN_REASON in reasons and not started_early else FAIL,
        )
    )
    job = foreign.get("job") or {}
    window = float((readings.get("settings") or {}).get("stability_window_s", 0))
    started = timestamp(job.get("started_at"))
    delay = None if started is None else started - stopped
    ok = (
        delay is not None
        and window - START_EARLY_SLACK_S <= delay <= window + START_LATE_SLACK_S
        and job.get("status") == "SUCCEEDED"
    )
    checks.append(
        Check(
            names[2],
            f"SUCCEEDED, started {window - START_EARLY_SLACK_S:g} to "
            f"{window + START_LATE_SLACK_S:g} s after the process ended (window {window:g} s)",
            f"job {job.get('id')} {job.get('status')}, "
            + ("never started" if delay is None else f"started {delay:.1f} s after"),
            PASS if ok else FAIL,
        )
    )
    return checks


def attribution_counts(readings: dict[str, Any], job_id: int) -> dict[str, Any]:
    """How NVML's processes of the job's own pids were attributed in the heartbeats.

    The job's pids are the driver's reading of /proc (every process a job starts carries
    GPUSCHED_JOB_ID), independent of the agent's own attribution; a pid seen once as the
    job's stays the job's (a heartbeat may list a process that ended since)."""
    key = str(job_id)
    polls = readings.get("polls", [])
    pids = {pid for poll in polls for pid in poll.get("job_pids", {}).get(key, [])}
    counts = {"polls": 0, "own": 0, "attributed": 0, "foreign": 0, "wrong": 0}
    listed: set[int] = set()
    for poll in polls:
        mine = [
            proc
            for gpu in poll.get("gpus", [])
            for proc in gpu.get("processes", [])
            if proc.get("pid") in pids or proc.get("job_id") == job_id
        ]
        counts["polls"] += bool(mine)
        for proc in mine:
            if proc.get("pid") not in pids:
                counts["wrong"] += 1  # a process not of the job's, taken for it
                continue
            counts["own"] += 1
            listed.add(proc["pid"])
            if proc.get("job_id") == job_id:
                counts["attributed"] += 1
            elif proc.get("job_id") is None:
                counts["foreign"] += 1
            else:
                counts["wrong"] += 1
    smi_listed = {a["pid"] for a in readings.get("smi_apps", []) if a.get("pid") in pids}
    return counts | {"pids": sorted(listed), "smi_only": sorted(smi_listed - listed)}


def _attribution(readings: dict[str, Any], phases: dict[str, Any]) -> list[Check]:
    checks = []
    for phase_name, name, known in (
        ("train", "training job's GPU process attributed to it", None),
        ("torchrun", "torchrun workers (2 on one GPU) attributed to the job", "issue 39"),
    ):
        phase = phases.get(phase_name) or {}
        job = phase.get("job") or {}
        expected = "every NVML process of the job's pids carries its job id; none counted foreign"
        if not job:
            checks.append(Check(name, expected, _not_reached(phase, readings), FAIL))
            continue
        c = attribution_counts(readings, job["id"])
        seen = (
            f"job {job['id']} {job.get('status')}; pids {c['pids']} on the GPU; of "
            f"{c['own']} listings in {c['polls']} polls: {c['attributed']} to the job, "
            f"{c['foreign']} foreign, {c['wrong']} to another job"
            + (f"; listed by nvidia-smi only: {c['smi_only']}" if c["smi_only"] else "")
        )
        ok = c["own"] > 0 and c["foreign"] == 0 and c["wrong"] == 0 and not c["smi_only"]
        if ok:
            result = PASS
        elif known and c["own"] > 0 and c["foreign"] > 0 and c["wrong"] == 0:
            result = KNOWN_FAIL
            seen += f" (known: {known})"
        else:
            result = FAIL
        checks.append(Check(name, expected, seen, result))
    return checks


def reported_isolation(node: dict[str, Any]) -> dict[str, Any] | None:
    """What the node says of its jobs' isolation (issue 32 adds it): its fields named so."""
    return {k: v for k, v in node.items() if "isolation" in k.lower() and v} or None


def fences_devices(reported: dict[str, Any] | None) -> bool:
    """Whether that isolation confines a job to its GPUs' device files: a cgroup's devices
    controller does; a subreaper alone does not."""
    return bool(reported) and any("cgroup" in str(v).lower() for v in reported.values())  # type: ignore[union-attr]


def _isolation(readings: dict[str, Any], phase: dict[str, Any]) -> Check:
    name = "device isolation: a job cannot open a GPU it was not given"
    if "reported" not in phase:
        return Check(name, "", _not_reached(phase, readings), FAIL)
    reported = phase.get("reported")
    if not fences_devices(reported):
        return Check(
            name,
            "checked where the node reports a device fence (cgroup)",
            f"not available: the node reports {reported}"
            if reported
            else "not available: the node reports no device isolation (issue 32)",
            SKIP,
        )
    result = phase.get("result") or {}
    opened = result.get("opened")
    if opened == [] and result.get("refused") == {}:
        # Simulated GPUs (a rehearsal): the machine has no GPU device file to be fenced.
        return Check(name, "a job given no GPU opens no /dev/nvidia<N>",
                     "no /dev/nvidia<N> on this machine", SKIP)  # fmt: skip
    ok = opened == [] and bool(result.get("refused"))
    return Check(
        name,
        f"node reports {reported}: a job given no GPU opens no /dev/nvidia<N>",
        f"opened {opened}, refused {result.get('refused')}"
        if result
        else _not_reached(phase, readings),
        PASS if ok else FAIL,
    )


def _estimate(readings: dict[str, Any], phases: dict[str, Any]) -> Check:
    name = "gpusched estimate vs PyTorch's peak memory"
    low, high = ESTIMATE_RATIO
    expected = (
        f"estimate / torch.cuda.max_memory_allocated in [{low:g}, {high:g}], for the "
        "parameters the model has"
    )
    estimate = phases.get("estimate") or {}
    response = estimate.get("response") or {}
    train = phases.get("train") or {}
    result = train.get("result") or {}
    peak = result.get("max_memory_allocated")
    if not response or not peak:
        if result.get("fake"):
            return Check(name, expected, "no PyTorch peak: a CPU stand-in (rehearsal)", FAIL)
        return Check(name, expected, _not_reached(estimate or train, readings), FAIL)
    total = response["per_gpu_bytes"]["total"]
    ratio = total / peak
    reserved = result.get("max_memory_reserved")
    job = train.get("job") or {}
    nvml_peak = max(
        (
            proc.get("used_memory_mb") or 0
            for poll in readings.get("polls", [])
            for gpu in poll.get("gpus", [])
            for proc in gpu.get("processes", [])
            if job and proc.get("job_id") == job.get("id")
        ),
        default=0,
    )
    parts = ", ".join(
        f"{k} {_fmt_gib(v)}" for k, v in response["per_gpu_bytes"].items() if k != "total"
    )
    seen = (
        f"estimate {_fmt_gib(total)} ({parts}; {response.get('parameters')} parameters "
        f"against {result.get('parameters')} in the model); PyTorch peak allocated "
        f"{_fmt_gib(peak)}, reserved {_fmt_gib(reserved)}; ratio {ratio:.2f}"
        + (f" ({total / reserved:.2f} of reserved)" if reserved else "")
        + (f"; the job's NVML process peak {nvml_peak} MiB" if nvml_peak else "")
    )
    same_model = response.get("parameters") == result.get("parameters")
    return Check(name, expected, seen, PASS if low <= ratio <= high and same_model else FAIL)


def _housekeeping(readings: dict[str, Any]) -> list[Check]:
    leftovers = readings.get("leftover_pids")
    began, ended = readings.get("started_at"), readings.get("finished_at")
    duration = None if began is None or ended is None else ended - began
    return [
        Check(
            "cleanup: nothing left running",
            "every process the check started has ended",
            "not recorded" if leftovers is None else f"left running: {leftovers or 'none'}",
            PASS if leftovers == [] else FAIL,
        ),
        Check(
            "ends within 6 minutes",
            f"<= {MAX_DURATION_S:g} s from the script's start, install included",
            "not recorded" if duration is None else f"{duration:.0f} s",
            PASS if duration is not None and duration <= MAX_DURATION_S else FAIL,
        ),
    ]


def exit_code(readings: dict[str, Any], checks: Sequence[Check]) -> int:
    if readings.get("mode") == "no-gpu":
        return EXIT_NO_GPU
    if readings.get("mode") == "setup-failed":
        return EXIT_SETUP
    return EXIT_FAILED if any(c.result == FAIL for c in checks) else EXIT_OK


# -- report.md ---------------------------------------------------------------------------

TABLE_HEADER = "| check | expected | seen | result |"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def counts(checks: Iterable[Check]) -> dict[str, int]:
    found = dict.fromkeys(RESULTS, 0)
    for check in checks:
        found[check.result] += 1
    return found


def render_report(readings: dict[str, Any], checks: Sequence[Check]) -> str:
    mode = readings.get("mode", "?")
    smi_gpus = (readings.get("smi") or {}).get("gpus", [])
    card = ", ".join(sorted({g.get("name", "?") for g in smi_gpus})) or "no GPU"
    began = readings.get("started_at")
    when = datetime.fromtimestamp(began, UTC).strftime("%Y-%m-%d %H:%M UTC") if began else "?"
    tally = counts(checks)
    lines = [f"# Real-GPU check: {card}", ""]
    if mode == "rehearsal":
        lines += [
            "**REHEARSAL on simulated GPUs, with CPU stand-ins for the GPU programs: no "
            "figure here is a hardware reading.**",
            "",
        ]
    driver = (readings.get("nvml") or {}).get("driver_version") or (
        smi_gpus[0].get("driver_version") if smi_gpus else None
    )
    lines += [
        f"Mode {mode}; {when} on {readings.get('host', '?')}"
        + (f", driver {driver}" if driver else "")
        + f". {tally[PASS]} pass, {tally[FAIL]} fail, {tally[KNOWN_FAIL]} known failing, "
        f"{tally[SKIP]} not available; exit code {exit_code(readings, checks)}.",
        "",
    ]
    if readings.get("error"):
        lines += [f"Stopped early: {readings['error']}", ""]
    lines += [TABLE_HEADER, "| --- | --- | --- | --- |"]
    lines += [
        f"| {_cell(c.name)} | {_cell(c.expected)} | {_cell(c.seen)} | {c.result} |" for c in checks
    ]
    lines += [
        "",
        "PASS: met. FAIL: not met. KNOWN-FAIL: not met, for a reason an open issue names (it "
        "does not fail the run). SKIP: not available on this node, not checked.",
        "",
        "Raw readings (nvidia-smi and NVML, the API's node readings, the jobs' telemetry, "
        "seff and the estimate) are in readings.json beside this file.",
        "",
    ]
    return "\n".join(lines)


def parse_report(text: str) -> list[Check]:
    """The checks of a report.md, as render_report wrote them."""
    lines = text.splitlines()
    try:
        start = lines.index(TABLE_HEADER) + 2
    except ValueError:
        raise ValueError("no check table in the report") from None
    checks = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) != 4 or cells[3] not in RESULTS:
            raise ValueError(f"not a check row: {line!r}")
        checks.append(Check(*cells))
    return checks
