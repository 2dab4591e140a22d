"""A GPU whose deciding readings failed is unknown, and unknown is not free: from the fake
NVML through the agent's heartbeat, the wire, the telemetry and a live cycle to the job's
pending reason and the node's API (issue 39)."""

from __future__ import annotations

from pathlib import Path

import pynvml

from app.db import utcnow
from app.nodes.telemetry import TelemetryPolicy, ingest_heartbeat
from app.wire import Heartbeat, dump, parse
from tests.agent.support import RecordingReporter, agent_without_gpus
from tests.agent.test_agent_nvml_backend import FakeGpu, FakeNvml, nvml_error
from tests.cycle.jobs_api import add_node, get_job, run_one_cycle, submit
from workers.agent.nvml_backend import NvmlGpuBackend


def _beat(api, tmp_path: Path, fake: FakeNvml) -> None:
    """One heartbeat of node n1's agent over `fake`, as the scheduler receives it."""
    agent = agent_without_gpus(tmp_path, RecordingReporter())
    heartbeat = agent.heartbeat(NvmlGpuBackend(nvml=fake).sample())
    with api.factory.begin() as session:
        ingest_heartbeat(
            session=session,
            heartbeat=parse(Heartbeat, dump(heartbeat)),
            policy=TelemetryPolicy(),
            now=utcnow(),
        )


def test_a_gpu_nvml_will_not_list_the_processes_of_takes_no_job(api, tmp_path: Path) -> None:
    add_node(api, gpus=1)
    fake = FakeNvml([FakeGpu("GPU-n1-0", used_mb=0, util_gpu=0)])
    fake.fail[("nvmlDeviceGetComputeRunningProcesses", 0)] = nvml_error(
        pynvml.NVML_ERROR_NO_PERMISSION
    )
    _beat(api, tmp_path, fake)
    job = submit(api, gpus=1)
    run_one_cycle(api)

    waiting = get_job(api, job["id"])
    assert waiting["status"] == "PENDING"
    assert waiting["pending_reason"] == "gpu_unknown"
    assert waiting["pending_message"].startswith(
        "node n1 gpu 0 unknown: could not read processes: NVMLError_NoPermission"
    )
    [gpu] = api.client.get("/api/v1/nodes/n1", headers=api.as_("alice")).json()["gpus"]
    assert gpu["healthy"] and gpu["unknown_readings"][0].startswith("processes: ")
    assert gpu["foreign_since"] is None
    metrics = api.client.get("/metrics").text
    assert 'gpusched_gpu_unknown{gpu="0",' in metrics
    [line] = [x for x in metrics.splitlines() if x.startswith("gpusched_gpu_unknown{")]
    assert line.endswith(" 1.0")

    # Readable again: known, idle, and the job starts.
    del fake.fail[("nvmlDeviceGetComputeRunningProcesses", 0)]
    _beat(api, tmp_path, fake)
    run_one_cycle(api)
    assert get_job(api, job["id"])["status"] == "SCHEDULED"


def test_a_mig_enabled_gpu_is_not_handed_out_whole(api, tmp_path: Path) -> None:
    add_node(api, gpus=1)
    fake = FakeNvml([FakeGpu("GPU-n1-0", used_mb=0, util_gpu=0, mig=True)])
    fake.fail[("nvmlDeviceGetUtilizationRates", 0)] = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    _beat(api, tmp_path, fake)
    job = submit(api, gpus=1)
    run_one_cycle(api)

    waiting = get_job(api, job["id"])
    assert (waiting["status"], waiting["pending_reason"]) == ("PENDING", "gpu_mig")
    assert waiting["pending_message"] == (
        "node n1 gpu 0 has MIG enabled: MIG slices are not scheduled"
    )
    [gpu] = api.client.get("/api/v1/nodes/n1", headers=api.as_("alice")).json()["gpus"]
    assert gpu["mig_enabled"] is True
