"""NVML as real nodes behave (issue 39): a reading that fails leaves its GPU unknown, not
free; health as NVIDIA's own tools judge it (XID events, remapped rows, hysteresis); MPS
clients counted; MIG-enabled GPUs refused; the versioned temperature call and utilisation
samples. The fake `pynvml` (tests/agent/test_agent_nvml_backend.py) models each case."""

from __future__ import annotations

from pathlib import Path

import pynvml

from tests.agent.support import RecordingReporter, agent_without_gpus
from tests.agent.test_agent_nvml_backend import FakeGpu, FakeNvml, nvml_error, two_gpus
from workers.agent.gpu_backend import open_backend
from workers.agent.nvml_backend import NvmlGpuBackend
from workers.agent.sim_backend import SimulatedGpus

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
    fake.fail[("nvmlDeviceGetTemperatureV", 0)] = nvml_error(NO_PERMISSION)
    fake.fail[("nvmlDeviceGetTemperature", 0)] = nvml_error(NO_PERMISSION)
    agent = agent_without_gpus(tmp_path, RecordingReporter())
    assert agent.heartbeat(NvmlGpuBackend(nvml=fake).sample()).gpus[0].unknown == ()


# -- health as NVIDIA's tools judge it ----------------------------------------------------


def _health(backend: NvmlGpuBackend, index: int = 0) -> tuple[bool, str | None]:
    gpu = backend.sample().gpus[index]
    return gpu.healthy, gpu.health_message


def test_a_critical_xid_marks_its_gpu_unhealthy_at_once_and_an_application_xid_does_not() -> None:
    fake = two_gpus()
    backend = NvmlGpuBackend(nvml=fake, unhealthy_after=3, healthy_after=2)
    assert fake.watched == {0, 1}
    for application_xid in (13, 31, 43, 45, 68, 109):  # the job's own faults
        fake.xid(1, application_xid)
    assert [g.healthy for g in backend.sample().gpus] == [True, True]

    fake.xid(1, 79)  # fallen off the bus
    first, second = backend.sample().gpus
    assert first.healthy
    assert not second.healthy and second.health_message is not None
    assert second.health_message.startswith("XID 79")
    # Back after healthy_after good readings, not at the next one.
    assert _health(backend, 1) == (
        False,
        f"{second.health_message} (recovering: 1 of 2 good readings)",
    )
    assert _health(backend, 1) == (True, None)


def test_the_hysteresis_is_the_agents_setting() -> None:
    fake = two_gpus()
    backend, _ = open_backend("nvml", nvml_module=fake, unhealthy_after=1, healthy_after=5)
    fake.fail[("nvmlDeviceGetMemoryInfo", 0)] = nvml_error(pynvml.NVML_ERROR_UNKNOWN)
    assert not backend.sample().gpus[0].healthy
    del fake.fail[("nvmlDeviceGetMemoryInfo", 0)]
    message = backend.sample().gpus[0].health_message
    assert message is not None and message.endswith("(recovering: 1 of 5 good readings)")


def test_an_xid_naming_no_gpu_concerns_every_gpu() -> None:
    fake = two_gpus()
    backend = NvmlGpuBackend(nvml=fake)
    fake.xid(None, 48)  # double-bit ECC error
    assert [g.healthy for g in backend.sample().gpus] == [False, False]


def test_remapped_rows_failed_or_pending_make_the_gpu_unhealthy_after_n_readings() -> None:
    fake = two_gpus()
    fake.gpus[0].remapped = (0, 3, 0, 1)
    fake.gpus[1].remapped = (2, 1, 1, 0)
    backend = NvmlGpuBackend(nvml=fake, unhealthy_after=2)
    first, second = backend.sample().gpus
    assert first.healthy and first.health_message is not None
    assert first.health_message.endswith("(1 of 2 bad readings)")
    first, second = backend.sample().gpus
    assert not first.healthy and not second.healthy
    assert first.health_message is not None and second.health_message is not None
    assert first.health_message.startswith("row remapping failed (3 rows remapped")
    assert second.health_message.startswith("row remapping pending: the GPU needs a reset")
    # Corrected rows alone (remapped, nothing pending) are a GPU doing its job.
    fake.gpus[1].remapped = (5, 0, 0, 0)
    assert NvmlGpuBackend(nvml=fake).sample().gpus[1].healthy


def test_an_nvlink_fabric_not_registered_makes_the_gpu_unhealthy() -> None:
    """HGX H100/H200: CUDA cannot use a GPU before the fabric manager has registered it."""
    fake = FakeNvml([FakeGpu(uuid=f"GPU-{n}") for n in range(4)])
    fake.gpus[0].fabric = (pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, pynvml.NVML_SUCCESS)
    fake.gpus[1].fabric = (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_ERROR_UNKNOWN)
    fake.gpus[2].fabric = (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS)
    # gpus[3]: no fabric (PCIe), the call is not supported.
    backend = NvmlGpuBackend(nvml=fake, unhealthy_after=1)
    training, failed, registered, pcie = backend.sample().gpus
    assert not training.healthy and not failed.healthy
    assert training.health_message is not None and failed.health_message is not None
    assert training.health_message.startswith("NVLink fabric registration in progress")
    assert failed.health_message.startswith("NVLink fabric registration failed (")
    assert registered.healthy and pcie.healthy
    # Once the fabric manager is done, the GPU is healthy again (after M good readings).
    fake.gpus[0].fabric = (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS)
    assert NvmlGpuBackend(nvml=fake).sample().gpus[0].healthy


def test_a_flaky_reading_does_not_flap_the_gpus_health() -> None:
    fake = two_gpus()
    backend = NvmlGpuBackend(nvml=fake, unhealthy_after=3, healthy_after=3)
    lost = ("nvmlDeviceGetMemoryInfo", 0)
    seen = []
    for bad in (True, False, True, True, False, True, False):  # never 3 bad in a row
        if bad:
            fake.fail[lost] = nvml_error(pynvml.NVML_ERROR_UNKNOWN)
        else:
            fake.fail.pop(lost, None)
        gpu = backend.sample().gpus[0]
        seen.append(gpu.healthy)
        # A bad reading is still no reading: the GPU is unknown for that sample.
        assert bool(gpu.unread) is bad
    assert seen == [True] * 7

    fake.fail[lost] = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    assert [_health(backend)[0] for _ in range(3)] == [True, True, False]
    del fake.fail[lost]
    assert [_health(backend)[0] for _ in range(3)] == [False, False, True]


def test_the_agent_reports_a_gpu_counting_bad_readings_as_unknown(tmp_path: Path) -> None:
    fake = two_gpus()
    fake.fail[("nvmlDeviceGetMemoryInfo", 0)] = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    agent = agent_without_gpus(tmp_path, RecordingReporter())
    first = agent.heartbeat(NvmlGpuBackend(nvml=fake).sample()).gpus[0]
    # Not yet called unhealthy (one bad reading), and not taken for free either.
    assert first.healthy
    assert [u.split(":")[0] for u in first.unknown] == ["memory", "processes"]


# -- MPS and MIG --------------------------------------------------------------------------


def test_mps_clients_and_graphics_processes_are_counted_once_each(tmp_path: Path) -> None:
    fake = FakeNvml(
        [
            FakeGpu(
                "GPU-mps",
                processes=[(500, 30)],  # the MPS daemon (nvidia-cuda-mps-server)
                mps_processes=[(4321, 6000), (4322, None)],  # someone's clients
                graphics_processes=[(500, 30), (777, 100)],
            )
        ]
    )
    [gpu] = NvmlGpuBackend(nvml=fake).sample().gpus
    assert sorted((p.pid, p.used_memory_mb) for p in gpu.processes) == [
        (500, 30),
        (777, 100),
        (4321, 6000),
        (4322, None),
    ]
    agent = agent_without_gpus(tmp_path, RecordingReporter())
    [reading] = agent.heartbeat(NvmlGpuBackend(nvml=fake).sample()).gpus
    assert reading.foreign_memory_mb == 6130  # the clients' memory is foreign load


def test_a_driver_without_mps_or_graphics_lists_still_reads_compute() -> None:
    fake = two_gpus()
    for query in (
        "nvmlDeviceGetMPSComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses",
    ):
        fake.fail[(query, 0)] = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    first = NvmlGpuBackend(nvml=fake).sample().gpus[0]
    assert [p.pid for p in first.processes] == [4321, 99] and not first.unread
    # No permission to list MPS clients hides them: the processes are unknown.
    fake.fail[("nvmlDeviceGetMPSComputeRunningProcesses", 0)] = nvml_error(NO_PERMISSION)
    assert "processes" in NvmlGpuBackend(nvml=fake).sample().gpus[0].unread


def test_a_mig_enabled_gpu_is_reported_as_such(tmp_path: Path) -> None:
    fake = FakeNvml(
        [FakeGpu("GPU-mig", mig=True), FakeGpu("GPU-off", mig=False), FakeGpu("GPU-old")]
    )
    # MIG leaves no utilisation for the whole GPU.
    fake.fail[("nvmlDeviceGetUtilizationRates", 0)] = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    agent = agent_without_gpus(tmp_path, RecordingReporter())
    readings = agent.heartbeat(NvmlGpuBackend(nvml=fake).sample()).gpus
    assert [g.mig_enabled for g in readings] == [True, False, False]
    assert [g.healthy for g in readings] == [True, True, True]
    # A mode NVML will not say is not "off".
    fake.fail[("nvmlDeviceGetMigMode", 2)] = nvml_error(pynvml.NVML_ERROR_UNKNOWN)
    third = agent.heartbeat(NvmlGpuBackend(nvml=fake).sample()).gpus[2]
    assert [u.split(":")[0] for u in third.unknown] == ["MIG mode"]


# -- utilisation samples and the versioned temperature -------------------------------------


def test_utilisation_is_the_mean_of_the_samples_since_the_last_reading(tmp_path: Path) -> None:
    # A bursty foreign process: busy between readings, idle at the instant of each snapshot.
    gpu = FakeGpu("GPU-0", util_gpu=0, processes=[(4321, 2048)])
    gpu.util_samples = [(1_000_000, 0), (1_166_000, 90), (1_333_000, 0), (1_500_000, 90)]
    fake = FakeNvml([gpu])
    backend = NvmlGpuBackend(nvml=fake)
    agent = agent_without_gpus(tmp_path, RecordingReporter())
    [reading] = agent.heartbeat(backend.sample()).gpus
    assert reading.util_pct == 45.0 and reading.foreign_util_pct == 45.0
    # The next reading counts only the samples taken since.
    gpu.util_samples += [(1_666_000, 30), (1_833_000, 10)]
    assert backend.sample().gpus[0].util_sm_pct == 20.0
    # None new (or no sampling at all): the snapshot answers.
    assert backend.sample().gpus[0].util_sm_pct == 0.0
    gpu.util_samples = None
    gpu.util_gpu = 12
    assert backend.sample().gpus[0].util_sm_pct == 12.0


def test_temperature_through_the_versioned_call_with_the_old_one_as_fallback() -> None:
    fake = two_gpus()
    fake.gpus[1].no_temperature_v = True
    first, second = NvmlGpuBackend(nvml=fake).sample().gpus
    assert (first.temperature_c, second.temperature_c) == (61.0, 61.0)
    assert fake.calls.count("nvmlDeviceGetTemperatureV") == 2
    assert fake.calls.count("nvmlDeviceGetTemperature") == 1  # only for the old driver


# -- CUDA_VISIBLE_DEVICES by UUID --------------------------------------------------------


def test_the_agent_gives_a_job_its_gpus_by_nvml_uuid(tmp_path: Path) -> None:
    agent = agent_without_gpus(tmp_path, RecordingReporter())
    agent.backend = NvmlGpuBackend(nvml=two_gpus())
    assert agent.gpu_uuids((1, 0)) == ("GPU-bbbb", "GPU-aaaa")
    assert agent.gpu_uuids(()) == ()
    # A GPU unreadable at start-up has no UUID to give: by index, all of them.
    fake = two_gpus()
    fake.fail[("nvmlDeviceGetUUID", 1)] = nvml_error(pynvml.NVML_ERROR_UNKNOWN)
    agent.backend = NvmlGpuBackend(nvml=fake)
    assert agent.gpu_uuids((0,)) == ("GPU-aaaa",)
    assert agent.gpu_uuids((0, 1)) == ()


def test_simulated_gpus_are_given_by_index(tmp_path: Path) -> None:
    agent = agent_without_gpus(tmp_path, RecordingReporter())
    agent.backend = SimulatedGpus(count=2, model="H100-80GB", memory_mb=81559, hostname="n1")
    assert agent.gpu_uuids((0, 1)) == ()
