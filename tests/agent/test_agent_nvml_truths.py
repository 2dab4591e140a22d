"""NVML as real nodes behave (issue 39): a reading that fails leaves its GPU unknown, not
free; health as NVIDIA's own tools judge it (XID events, remapped rows, hysteresis); MPS
clients counted; MIG-enabled GPUs refused; the versioned temperature call and utilisation
samples. The fake `pynvml` (tests/agent/test_agent_nvml_backend.py) models each case."""

from __future__ import annotations

from pathlib import Path

import pynvml

from tests.agent.support import RecordingReporter, agent_without_gpus
from tests.agent.test_agent_nvml_backend import FakeGpu, FakeNvml, nvml_error, two_gpus
from workers.agent.nvml_backend import NvmlGpuBackend

NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION


# -- unknown is not free ------------------------------------------------------------------


def test_a_process_list_nvml_will_not_give_leaves_the_gpu_unknown(tmp_path: Path) -> None:
    fake = two_gpus()
    fake.fail[("nvmlDeviceGetComputeRunningProcesses", 1)] = nvml_error(NO_PERMISSION)
    backend = NvmlGpuBackend(nvml=fake)
    agent = agent_without_gpus(tmp_path, RecordingReporter())
    first, second = agent.heartbeat(backend.sample()).gpus
    assert first.unknown == ()
    # Still healthy (no permission says nothing about the GPU), but not "no processes".
    assert second.healthy and second.processes == ()
    [why] = second.unknown
    assert why.startswith("processes: NVMLError_NoPermission: Insufficient Permissions")


def test_a_memory_reading_that_fails_is_unknown_not_zero(tmp_path: Path) -> None:
    fake = two_gpus()
    fake.fail[("nvmlDeviceGetMemoryInfo", 0)] = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    agent = agent_without_gpus(tmp_path, RecordingReporter())
    first = agent.heartbeat(NvmlGpuBackend(nvml=fake).sample()).gpus[0]
    assert first.memory_used_mb is None
    assert [u.split(":")[0] for u in first.unknown] == ["memory"]


def test_utilisation_is_needed_only_to_judge_a_foreign_process(tmp_path: Path) -> None:
    fake = FakeNvml([FakeGpu("GPU-idle"), FakeGpu("GPU-foreign", processes=[(4321, 2048)])])
    for index in (0, 1):
        fake.fail[("nvmlDeviceGetUtilizationRates", index)] = nvml_error(NO_PERMISSION)
    agent = agent_without_gpus(tmp_path, RecordingReporter())
    idle, foreign = agent.heartbeat(NvmlGpuBackend(nvml=fake).sample()).gpus
    # No process there: nothing to weigh, so a missing utilisation decides nothing.
    assert idle.unknown == ()
    # A foreign process of unknown load is not "0 % foreign".
    assert [u.split(":")[0] for u in foreign.unknown] == ["utilisation"]


def test_temperature_and_power_decide_nothing(tmp_path: Path) -> None:
    fake = two_gpus()
    fake.fail[("nvmlDeviceGetPowerUsage", 0)] = nvml_error(NO_PERMISSION)
    fake.fail[("nvmlDeviceGetTemperature", 0)] = nvml_error(NO_PERMISSION)
    agent = agent_without_gpus(tmp_path, RecordingReporter())
    assert agent.heartbeat(NvmlGpuBackend(nvml=fake).sample()).gpus[0].unknown == ()
