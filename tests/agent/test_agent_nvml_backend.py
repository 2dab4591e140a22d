"""NVML backend against a fake ``pynvml`` module raising the real NVML exception classes.

No GPU is needed: the fake answers like NVML does (bytes, mW, objects with
attributes) and fails where a test tells it to, with ``pynvml.NVMLError(code)``,
which pynvml maps to its per-code subclasses (``NVMLError_GpuIsLost`` ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from workers.agent.gpu_backend import BackendUnavailable, GpuProcess, open_backend
from workers.agent.nvml_backend import NvmlGpuBackend
from workers.agent.sim_backend import SimulatedGpus

MIB = 1024 * 1024


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    total_mb: int = 81559
    used_mb: int = 1000
    util_gpu: int = 55
    util_memory: int = 30
    temperature: int = 61
    power_mw: int = 312_500
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    bus_id: str = ""
    nvlinks: list[str] = field(default_factory=list)  # remote bus id per active link
    # nvmlDeviceGetRemappedRows: rows remapped for correctable / uncorrectable errors, a
    # remapping pending (a reset applies it), a remapping failed.
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)
    # Clients of an MPS daemon: NVML lists them only in the MPS query, not as compute.
    mps_processes: list[tuple[int, int | None]] = field(default_factory=list)
    graphics_processes: list[tuple[int, int | None]] = field(default_factory=list)
    # MIG mode now (None: a GPU that cannot do MIG, which answers NOT_SUPPORTED).
    mig: bool | None = None
    # The driver's utilisation samples, (timestamp µs, percent); None: it keeps none.
    util_samples: list[tuple[int, int]] | None = None
    # A driver from before nvmlDeviceGetTemperatureV.
    no_temperature_v: bool = False
    # nvmlDeviceGetGpuFabricInfo: (state, status) on an NVSwitch system; None: no fabric
    # (the call answers NOT_SUPPORTED, as on PCIe GPUs).
    fabric: tuple[int, int] | None = None


@dataclass(frozen=True)
class Handle:
    index: int


class FakeNvml:
    """The slice of pynvml the backend uses. ``fail[(function, gpu_index)]``
    (or ``fail[(function, None)]`` for non-device calls) is raised instead.
    ``xid(gpu_index, xid)`` is a critical XID event the driver queues for the next
    nvmlEventSetWait (``gpu_index`` None: an event naming no GPU)."""

    NVMLError = pynvml.NVMLError
    NVML_ERROR_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
    NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_P2P_CAPS_INDEX_NVLINK = pynvml.NVML_P2P_CAPS_INDEX_NVLINK
    NVML_P2P_STATUS_OK = pynvml.NVML_P2P_STATUS_OK
    NVML_NVLINK_MAX_LINKS = 4
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_GPU_UTILIZATION_SAMPLES = pynvml.NVML_GPU_UTILIZATION_SAMPLES

    def __init__(self, gpus: list[FakeGpu], *, p2p: set[frozenset[int]] | None = None) -> None:
        self.gpus = gpus
        self.p2p = p2p
        self.fail: dict[tuple[str, int | None], BaseException] = {}
        self.calls: list[str] = []
        self.shutdowns = 0
        self.events: list[SimpleNamespace] = []
        self.watched: set[int] = set()  # GPUs registered for XID events
        self.event_sets_freed = 0

    def _check(self, function: str, index: int | None = None) -> None:
        self.calls.append(function)
        error = self.fail.get((function, index))
        if error is not None:
            raise error

    def nvmlInit(self) -> None:
        self._check("nvmlInit")

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion")
        return "550.54.15"

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._check("nvmlDeviceGetHandleByIndex", index)
        return Handle(index)

    def _device(self, function: str, handle: Handle) -> FakeGpu:
        self._check(function, handle.index)
        return self.gpus[handle.index]

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        return self._device("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: Handle) -> bytes:
        return self._device("nvmlDeviceGetName", handle).name.encode()  # old bindings: bytes

    def nvmlDeviceGetMemoryInfo(self, handle: Handle) -> SimpleNamespace:
        gpu = self._device("nvmlDeviceGetMemoryInfo", handle)
        return SimpleNamespace(
            total=gpu.total_mb * MIB,
            used=gpu.used_mb * MIB,
            free=(gpu.total_mb - gpu.used_mb) * MIB,
        )

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> SimpleNamespace:
        gpu = self._device("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=gpu.util_gpu, memory=gpu.util_memory)

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._device("nvmlDeviceGetTemperature", handle).temperature

    def nvmlDeviceGetTemperatureV(self, handle: Handle, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        gpu = self._device("nvmlDeviceGetTemperatureV", handle)
        if gpu.no_temperature_v:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return gpu.temperature

    def nvmlDeviceGetSamples(
        self, handle: Handle, kind: int, since: int
    ) -> tuple[int, list[SimpleNamespace]]:
        assert kind == pynvml.NVML_GPU_UTILIZATION_SAMPLES
        gpu = self._device("nvmlDeviceGetSamples", handle)
        if gpu.util_samples is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        # As the driver: samples after `since`, none at all is NOT_FOUND.
        newer = [(at, v) for at, v in gpu.util_samples if at > since]
        if not newer:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        value_type = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        return value_type, [
            SimpleNamespace(timeStamp=at, sampleValue=SimpleNamespace(uiVal=v)) for at, v in newer
        ]

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        return self._device("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[SimpleNamespace]:
        gpu = self._device("nvmlDeviceGetComputeRunningProcesses", handle)
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=None if mb is None else mb * MIB)
            for pid, mb in gpu.processes
        ]

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Handle) -> list[SimpleNamespace]:
        self.calls.append("v2")
        gpu = self.gpus[handle.index]
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=(mb or 0) * MIB) for pid, mb in gpu.processes
        ]

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Handle) -> list[SimpleNamespace]:
        gpu = self._device("nvmlDeviceGetMPSComputeRunningProcesses", handle)
        return _processes(gpu.mps_processes)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Handle) -> list[SimpleNamespace]:
        gpu = self._device("nvmlDeviceGetGraphicsRunningProcesses", handle)
        return _processes(gpu.graphics_processes)

    def nvmlDeviceGetMigMode(self, handle: Handle) -> list[int]:
        gpu = self._device("nvmlDeviceGetMigMode", handle)
        if gpu.mig is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = int(pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig else pynvml.NVML_DEVICE_MIG_DISABLE)
        return [mode, mode]

    c_nvmlGpuFabricInfo_t = pynvml.c_nvmlGpuFabricInfo_t

    def nvmlDeviceGetGpuFabricInfo(self, handle: Handle, info: Any) -> int:
        assert type(info).__name__ == "CArgObject", "pass ctypes.byref(info)"
        fabric = self._device("nvmlDeviceGetGpuFabricInfo", handle).fabric
        if fabric is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        # The real call writes through a pointer: a structure passed by value crashes the
        # process (seen on an H200), so only a ctypes.byref is taken here.
        target = info._obj
        target.state, target.status = fabric
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetRemappedRows(self, handle: Handle) -> tuple[int, int, int, int]:
        return self._device("nvmlDeviceGetRemappedRows", handle).remapped

    # -- events: only critical XIDs, as the backend registers for

    def xid(self, index: int | None, xid: int) -> None:
        device = None if index is None else Handle(index)
        if index is None or index in self.watched:
            self.events.append(
                SimpleNamespace(
                    device=device, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid
                )
            )

    def nvmlEventSetCreate(self) -> str:
        self._check("nvmlEventSetCreate")
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: Handle, types: int, event_set: str) -> None:
        assert event_set == "event-set" and types & pynvml.nvmlEventTypeXidCriticalError
        self._check("nvmlDeviceRegisterEvents", handle.index)
        self.watched.add(handle.index)

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        assert event_set == "event-set" and timeout_ms == 0  # never blocks the sampling
        self._check("nvmlEventSetWait")
        if not self.events:
            raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
        return self.events.pop(0)

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.event_sets_freed += 1

    def nvmlDeviceGetP2PStatus(self, first: Handle, second: Handle, capability: int) -> int:
        assert capability == pynvml.NVML_P2P_CAPS_INDEX_NVLINK
        self._check("nvmlDeviceGetP2PStatus", first.index)
        if self.p2p is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        linked = frozenset({first.index, second.index}) in self.p2p
        return int(pynvml.NVML_P2P_STATUS_OK if linked else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED)

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> SimpleNamespace:
        return SimpleNamespace(busId=self._device("nvmlDeviceGetPciInfo", handle).bus_id.encode())

    def nvmlDeviceGetNvLinkState(self, handle: Handle, link: int) -> int:
        gpu = self._device("nvmlDeviceGetNvLinkState", handle)
        if not gpu.nvlinks:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(gpu.nvlinks):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Handle, link: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self.gpus[handle.index].nvlinks[link].encode())


def _processes(listed: list[tuple[int, int | None]]) -> list[SimpleNamespace]:
    return [
        SimpleNamespace(pid=pid, usedGpuMemory=None if mb is None else mb * MIB)
        for pid, mb in listed
    ]


def two_gpus(**kwargs: Any) -> FakeNvml:
    return FakeNvml(
        [
            FakeGpu("GPU-aaaa", processes=[(4321, 2048), (99, None)]),
            FakeGpu("GPU-bbbb", used_mb=0, util_gpu=0, util_memory=0, power_mw=70_000),
        ],
        **kwargs,
    )


def test_the_fake_raises_the_real_pynvml_subclasses() -> None:
    # pynvml.NVMLError.__new__ maps a code to its subclass; except-clauses on
    # NVMLError catch them all.
    assert type(nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)) is pynvml.NVMLError_GpuIsLost
    assert isinstance(nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED), pynvml.NVMLError_NotSupported)


def test_readings_are_converted_to_our_units() -> None:
    backend = NvmlGpuBackend(nvml=two_gpus(p2p={frozenset({0, 1})}), hostname="gpu-node-1")
    info = backend.node_info()
    assert (info.hostname, info.driver_version, info.backend) == ("gpu-node-1", "550.54.15", "nvml")
    assert [(g.index, g.uuid, g.model, g.memory_total_mb) for g in info.gpus] == [
        (0, "GPU-aaaa", "NVIDIA H100 80GB HBM3", 81559),
        (1, "GPU-bbbb", "NVIDIA H100 80GB HBM3", 81559),
    ]
    assert [g.nvlink_peers for g in info.gpus] == [(1,), (0,)]

    first, second = backend.sample().gpus
    assert first.healthy and first.health_message is None
    assert (first.util_sm_pct, first.util_mem_pct) == (55.0, 30.0)
    assert (first.memory_used_mb, first.memory_free_mb) == (1000, 80559)
    assert (first.temperature_c, first.power_w) == (61.0, 312.5)  # mW -> W
    assert first.processes == (GpuProcess(4321, 2048), GpuProcess(99, None))
    assert second.uuid == "GPU-bbbb" and second.processes == ()


def test_not_supported_query_becomes_none_and_the_gpu_stays_healthy() -> None:
    fake = two_gpus()
    fake.fail[("nvmlDeviceGetPowerUsage", 0)] = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    fake.fail[("nvmlDeviceGetTemperature", 0)] = nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
    fake.fail[("nvmlDeviceGetTemperatureV", 0)] = nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
    first, second = NvmlGpuBackend(nvml=fake).sample().gpus
    assert first.healthy
    assert first.power_w is None and first.temperature_c is None
    assert first.util_sm_pct == 55.0 and first.memory_used_mb == 1000
    assert second.power_w == 70.0


def test_gpu_lost_marks_only_that_gpu_unhealthy_and_sample_does_not_raise() -> None:
    fake = two_gpus()
    backend = NvmlGpuBackend(nvml=fake, unhealthy_after=1, healthy_after=1)
    fake.fail[("nvmlDeviceGetMemoryInfo", 1)] = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    fake.calls.clear()
    first, second = backend.sample().gpus
    assert first.healthy and first.util_sm_pct == 55.0
    assert not second.healthy
    assert second.health_message is not None
    assert second.health_message.startswith("NVMLError_GpuIsLost: GPU is lost")
    assert "nvmlDeviceGetMemoryInfo" in second.health_message
    assert (second.memory_used_mb, second.util_sm_pct, second.power_w) == (None, None, None)
    # After the GPU is known lost, no further (slow) calls are made to it.
    assert fake.calls.count("nvmlDeviceGetPowerUsage") == 1

    del fake.fail[("nvmlDeviceGetMemoryInfo", 1)]
    assert backend.sample().gpus[1].healthy  # e.g. after a reset


def test_gpu_lost_at_start_up_keeps_its_index_and_reports_unhealthy() -> None:
    fake = two_gpus()
    lost = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    fake.fail[("nvmlDeviceGetHandleByIndex", 1)] = lost
    backend = NvmlGpuBackend(nvml=fake, unhealthy_after=1)
    assert [g.uuid for g in backend.node_info().gpus] == ["GPU-aaaa", "GPU-unreadable-1"]
    reading = backend.sample().gpus[1]
    assert not reading.healthy
    assert reading.health_message is not None and "GpuIsLost" in reading.health_message


def test_unexpected_exception_is_reported_as_unhealthy_not_raised() -> None:
    fake = two_gpus()
    backend = NvmlGpuBackend(nvml=fake, unhealthy_after=1)
    fake.fail[("nvmlDeviceGetUtilizationRates", 0)] = RuntimeError("driver returned garbage")
    first, second = backend.sample().gpus
    assert not first.healthy
    assert first.health_message is not None and "garbage" in first.health_message
    assert second.healthy


def test_old_driver_falls_back_to_v2_process_query() -> None:
    fake = two_gpus()
    fake.fail[("nvmlDeviceGetComputeRunningProcesses", 0)] = pynvml.NVMLLibraryMismatchError("old")
    first = NvmlGpuBackend(nvml=fake).sample().gpus[0]
    assert first.healthy
    assert [p.pid for p in first.processes] == [4321, 99]
    assert "v2" in fake.calls


def test_nvlink_peers_from_link_state_when_p2p_query_is_unsupported() -> None:
    fake = FakeNvml(
        [
            FakeGpu("GPU-0", bus_id="00000000:18:00.0", nvlinks=["0000:2A:00.0", "0000:2A:00.0"]),
            FakeGpu("GPU-1", bus_id="00000000:2A:00.0", nvlinks=["0000:18:00.0"]),
            FakeGpu("GPU-2", bus_id="00000000:3B:00.0"),  # PCIe only
        ]
    )
    peers = [g.nvlink_peers for g in NvmlGpuBackend(nvml=fake).node_info().gpus]
    assert peers == [(1,), (0,), ()]


def test_library_not_found_raises_backend_unavailable() -> None:
    fake = two_gpus()
    fake.fail[("nvmlInit", None)] = nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(BackendUnavailable, match="NVMLError_LibraryNotFound"):
        NvmlGpuBackend(nvml=fake)


def test_auto_falls_back_to_simulated_gpus_and_says_why() -> None:
    fake = two_gpus()
    fake.fail[("nvmlInit", None)] = nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    for spec in (None, "auto"):
        backend, line = open_backend(spec, nvml_module=fake)
        assert isinstance(backend, SimulatedGpus)
        assert len(backend.node_info().gpus) == 4
        assert line == (
            "NVML unavailable (NVMLError_LibraryNotFound: NVML Shared Library Not Found); "
            "using simulated GPUs sim:4:H100-80GB"
        )


def test_forced_nvml_does_not_fall_back() -> None:
    fake = two_gpus()
    fake.fail[("nvmlInit", None)] = nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(BackendUnavailable, match="DriverNotLoaded"):
        open_backend("nvml", nvml_module=fake)


def test_auto_uses_nvml_when_it_works() -> None:
    backend, line = open_backend("auto", nvml_module=two_gpus(), hostname="n")
    assert isinstance(backend, NvmlGpuBackend)
    assert line == "using NVML: 2 GPU(s) NVIDIA H100 80GB HBM3, driver 550.54.15"


def test_auto_with_no_gpus_falls_back_and_releases_nvml() -> None:
    fake = FakeNvml([])
    backend, line = open_backend("auto", nvml_module=fake)
    assert isinstance(backend, SimulatedGpus)
    assert "NVML initialised but reports no GPUs" in line
    assert fake.shutdowns == 1


def test_close_is_idempotent() -> None:
    fake = two_gpus()
    backend = NvmlGpuBackend(nvml=fake)
    backend.close()
    backend.close()
    assert fake.shutdowns == 1
    assert fake.event_sets_freed == 1  # the XID event set goes with it


def test_real_pynvml_on_a_machine_without_gpus() -> None:
    try:
        NvmlGpuBackend().close()
    except BackendUnavailable:
        backend, line = open_backend("auto")
        assert isinstance(backend, SimulatedGpus)
        assert line.startswith("NVML unavailable (NVMLError_")
    else:
        pytest.skip("this machine has working NVML")


def test_broken_library_below_nvml_is_backend_unavailable() -> None:
    fake = two_gpus()
    fake.fail[("nvmlDeviceGetCount", None)] = OSError("libnvidia-ml.so.1: bad ELF")
    with pytest.raises(BackendUnavailable, match="OSError"):
        NvmlGpuBackend(nvml=fake)
    assert fake.shutdowns == 1
    backend, line = open_backend("auto", nvml_module=fake)
    assert isinstance(backend, SimulatedGpus) and "bad ELF" in line


def test_importing_the_agent_package_does_not_load_nvml() -> None:
    import subprocess
    import sys

    code = "import sys, workers.agent; print('pynvml' in sys.modules)"
    repo_root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo_root
    )
    assert result.stdout.strip() == "False"


class FakeCuda:
    """libcuda's primary context, as the PID probe uses it: retaining it puts `pid` (as the
    driver names it) in GPU 0's process list."""

    def __init__(self, gpu: FakeGpu, pid: int, *, init: int = 0) -> None:
        self.gpu, self.pid, self.init, self.retained = gpu, pid, init, 0

    def cuInit(self, flags: int) -> int:
        return self.init

    def cuDeviceGet(self, device: object, ordinal: int) -> int:
        return 0

    def cuDevicePrimaryCtxRetain(self, context: object, device: object) -> int:
        self.retained += 1
        self.gpu.processes.append((self.pid, 300))
        return 0

    def cuDevicePrimaryCtxRelease(self, device: object) -> int:
        self.retained -= 1
        self.gpu.processes.remove((self.pid, 300))
        return 0


def test_the_pid_probe_asks_whether_nvml_lists_our_own_cuda_context() -> None:
    import os

    fake = two_gpus()
    backend = NvmlGpuBackend(nvml=fake, hostname="n")
    ours = FakeCuda(fake.gpus[0], os.getpid())
    assert backend.reports_local_pids(cuda=ours) is True
    assert ours.retained == 0 and (os.getpid(), 300) not in fake.gpus[0].processes
    host = FakeCuda(fake.gpus[0], 4_000_000)  # what an untranslating driver says
    assert backend.reports_local_pids(cuda=host) is False
    assert backend.reports_local_pids(cuda=FakeCuda(fake.gpus[0], 1, init=100)) is None
