"""A synthetic real-GPU session as bench/gpu_check.py records it (readings.json), modelled
on one H100 (its name, memory and driver as the run of 2026-11-25 saw them): every reading
made from one timeline, so that a session judged as it is passes everything but the known
torchrun failure, and each test changes one thing to see one check fail."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

T0 = 1_795_000_000.0
UUID = "GPU-3f0a6a55-1c0e-8c8e-5e0b-3b1f2c7d9a10"
MODEL = "NVIDIA H100 80GB HBM3"
TOTAL_MB = 81559
IDLE_MB = 620  # the driver's own (total - free on an idle H100)
TOPOLOGY_ONE_GPU = """\
\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \t0-15\t0\t\tN/A

Legend:

  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks
"""
# (start, end, GPU util %, memory MiB over idle, watts) of each workload, seconds after T0.
TRAIN = (15.0, 78.0, 99.0, 16_400, 650.0)
FOREIGN = (100.0, 131.0, 100.0, 1_500, 600.0)
PROBE = (140.0, 146.0, 90.0, 900, 500.0)
TORCHRUN = (152.0, 175.0, 100.0, 1_800, 620.0)
PIDS = {"train": 4242, "foreign": 5000, "torchrun": 6000, "workers": (6001, 6002)}


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


def state(t: float) -> tuple[float, float, float]:
    """(util %, memory used MiB as total - free, power W) at t."""
    for start, end, util, memory, power in (TRAIN, FOREIGN, PROBE, TORCHRUN):
        if start <= t - T0 < end:
            return util, IDLE_MB + memory, power
    return 0.0, IDLE_MB, 70.0


def processes(t: float, *, workers_job_id: int | None = None) -> list[dict[str, Any]]:
    s = t - T0
    if TRAIN[0] <= s < TRAIN[1]:
        return [{"pid": PIDS["train"], "used_memory_mb": 16_300, "job_id": 1}]
    if FOREIGN[0] <= s < FOREIGN[1]:
        return [{"pid": PIDS["foreign"], "used_memory_mb": 1_400, "job_id": None}]
    if TORCHRUN[0] <= s < TORCHRUN[1]:
        # Today torchrun's workers are in sessions of their own: counted foreign (issue 39).
        return [
            {"pid": p, "used_memory_mb": 900, "job_id": workers_job_id} for p in PIDS["workers"]
        ]
    return []


def job(
    job_id: int, name: str, start: float, end: float, status: str = "SUCCEEDED"
) -> dict[str, Any]:
    return {
        "id": job_id, "name": name, "status": status, "gpus": 1,
        "scheduled_at": iso(T0 + start - 0.3), "started_at": iso(T0 + start - 0.2),
        "finished_at": iso(T0 + end + 0.5),
        # As the API answers for a job that has ended: its GPUs are released.
        "allocations": [] if status in ("SUCCEEDED", "FAILED") else
        [{"node": "gpu-node", "gpu_index": 0, "share": 1.0, "rank": 0}],
    }  # fmt: skip


def session() -> dict[str, Any]:
    smi_samples = []
    for i in range(440):  # every 0.5 s for 220 s
        t = T0 + i * 0.5
        util, used, power = state(t)
        smi_samples.append({
            "t": t, "index": 0, "util_pct": util, "memory_total_mb": TOTAL_MB,
            "memory_free_mb": TOTAL_MB - used, "memory_used_mb": used - 500, "power_w": power,
        })  # fmt: skip
    polls, telemetry = [], []
    for i in range(5, 215):
        t = T0 + i
        util, used, power = state(t - 0.4)  # the agent read NVML a moment before
        s = i
        job_pids: dict[str, list[int]] = {}
        if TRAIN[0] - 2 <= s < TRAIN[1] + 1:
            job_pids["1"] = [PIDS["train"]]
        if TORCHRUN[0] - 2 <= s < TORCHRUN[1] + 1:
            job_pids["3"] = [PIDS["torchrun"], *PIDS["workers"]]
        foreign = FOREIGN[0] <= s - 0.4 < FOREIGN[1]
        gpu = {
            "index": 0, "sampled_at": iso(t - 0.1), "util_pct": util, "memory_used_mb": used,
            "power_w": power, "processes": processes(t - 0.4),
            "foreign_util_pct": util if foreign else 0.0,
            "foreign_memory_mb": 1_400 if foreign else 0, "foreign_since": None,
            "allocated": 1.0 if TRAIN[0] - 5 <= s < TRAIN[1] + 1 else 0.0, "healthy": True,
        }  # fmt: skip
        polls.append({"t": t, "node_state": "READY", "job_pids": job_pids, "gpus": [gpu]})
        if TRAIN[0] - 5 <= s <= TRAIN[1] + 1:
            telemetry.append({
                "at": iso(t - 0.1), "node": "gpu-node", "gpu_index": 0, "util_pct": util,
                "memory_used_mb": used, "power_w": power, "resolution_s": 1,
            })  # fmt: skip
    train_job = job(1, "gpu-check-train", TRAIN[0] - 5, TRAIN[1])
    busy = [p for p in telemetry]
    efficiency = {
        "job_id": 1,
        "avg_util_pct": sum(p["util_pct"] for p in busy) / len(busy),
        "peak_memory_mb": max(p["memory_used_mb"] for p in busy),
        "energy_wh": sum(p["power_w"] for p in busy) / 3600,
        "per_gpu": [{"node": "gpu-node", "gpu_index": 0, "samples": len(busy)}],
    }
    foreign_stopped = T0 + FOREIGN[1] + 0.2
    job_polls = [
        {"t": T0 + s, "status": "PENDING", "pending_reason": "foreign_process",
         "pending_message": "GPU busy with foreign process on node gpu-node gpu 0 (100% util)"}
        for s in range(112, 131)
    ] + [{"t": T0 + 141, "status": "RUNNING", "pending_reason": None, "pending_message": None}]  # fmt: skip
    waits_job = job(2, "gpu-check-waits", PROBE[0], PROBE[1])
    waits_job["started_at"] = iso(foreign_stopped + 9.0)
    return {
        "schema": 1, "mode": "gpu", "host": "gpu-node", "error": None,
        "started_at": T0 - 40, "finished_at": T0 + 230,
        "settings": {"stability_window_s": 8.0, "sample_interval_s": 1.0,
                     "foreign_util_threshold_pct": 10.0},
        "smi": {"gpus": [{"index": 0, "name": MODEL, "uuid": UUID, "memory_total_mb": TOTAL_MB,
                          "driver_version": "580.159.04"}], "topology": TOPOLOGY_ONE_GPU},
        "nvml": {"driver_version": "580.159.04"},
        "smi_samples": smi_samples,
        "smi_apps": [{"t": T0 + s, "pid": PIDS["train"], "used_memory_mb": 16_300, "index": 0}
                     for s in range(16, 77)],
        "node": {"name": "gpu-node", "gpu_backend": "nvml", "state": "READY",
                 "gpus": [{"index": 0, "uuid": UUID, "model": MODEL, "memory_total_mb": TOTAL_MB,
                           "nvlink_peers": []}]},
        "polls": polls,
        "phases": {
            "train": {
                "job_id": 1, "job": train_job, "telemetry": telemetry, "efficiency": efficiency,
                "result": {"workload": "train", "fake": False, "steps": 610, "seconds": 60.0,
                           "device": MODEL, "cuda_visible_devices": "0",
                           "shape": {"layers": 12, "hidden": 2048, "heads": 16, "vocab": 32768,
                                     "seq_len": 1024},
                           "micro_batch": 8, "parameters": 673_509_376,
                           "max_memory_allocated": 17_000_000_000,
                           "max_memory_reserved": 17_600_000_000},
            },
            # `gpusched estimate --architecture gpt --transformer 12,2048,16,32768,1024
            # --precision bf16 --micro-batch 8`, as it answered on 2026-11-26.
            "estimate": {"response": {"parameters": 673_509_376, "per_gpu_bytes": {
                "weights": 1_347_018_752, "gradients": 1_347_018_752,
                "optimizer_states": 2_694_037_504, "activations": 15_971_909_632,
                "overhead": 2_141_741_056, "total": 23_501_725_696}}},
            "foreign": {"pid": PIDS["foreign"], "started_at": T0 + FOREIGN[0] - 3,
                        "seen_at": T0 + 110, "stopped_at": foreign_stopped, "job_id": 2,
                        "job_polls": job_polls, "job": waits_job},
            "torchrun": {"job_id": 3, "job": job(3, "gpu-check-torchrun", *TORCHRUN[:2])},
            "isolation": {"reported": None},
        },
        "leftover_pids": [],
        "stop_leftovers": [],
    }  # fmt: skip


def changed(base: dict[str, Any] | None = None) -> dict[str, Any]:
    """A deep copy to change (the session itself stays as it is)."""
    return copy.deepcopy(base if base is not None else session())
