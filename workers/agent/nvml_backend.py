"""Real GPUs through NVML. The only module in the project that imports ``pynvml``.

Every NVML call goes through :meth:`NvmlGpuBackend._call`, which turns NVML
errors into data: a query the GPU does not support becomes ``None``; a GPU
that has fallen off the bus (or needs a reset, or answers garbage) becomes
``healthy=False`` with the error as the message. ``sample()`` never raises
for a GPU problem, because one sick GPU must not stop the agent from
reporting the healthy ones (and from reporting the sick one as sick).

Health is judged as NVIDIA's own tools judge it (k8s-device-plugin, DCGM exporter):
critical XID events (application XIDs, the job's own faults, ignored), remapped rows
pending or failed, the NVLink fabric's registration where NVSwitch exists, and NVML calls
that fail. A failing reading counts toward
``unhealthy_after`` consecutive bad ones before the GPU is called unhealthy, and it is
called healthy again only after ``healthy_after`` good ones (no flapping); an XID is the
driver's own verdict and marks it unhealthy at once.

The ``pynvml`` module is a constructor parameter so the error handling can be
tested without a GPU, by passing a small fake module that raises the real
``pynvml.NVMLError`` subclasses.
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import pynvml

from workers.agent.gpu_backend import (
    READING_MEMORY,
    READING_MIG_MODE,
    READING_PROCESSES,
    READING_UTILISATION,
    UNREADABLE_UUID,
    BackendUnavailable,
    GpuProcess,
    GpuSample,
    GpuStatic,
    NodeInfo,
    NodeSample,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")
_MIB = 1024 * 1024
# nvmlGpuFabricState_t (nvml.h): a GPU on an NVSwitch fabric is usable once COMPLETED.
_FABRIC_STATE_NOT_SUPPORTED, _FABRIC_STATE_NOT_STARTED, _FABRIC_STATE_COMPLETED = 0, 1, 3

# XIDs a job's own fault raises (illegal address, MMU fault from the job, reset channel
# for it...): NVIDIA's k8s-device-plugin ignores these; every other XID is the GPU's.
APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
# Defaults of the hysteresis: unhealthy after 3 bad readings in a row (15 s at the
# agent's 5 s), healthy again after 12 good ones (a minute).
UNHEALTHY_AFTER = 3
HEALTHY_AFTER = 12
# nvmlValueType_t -> the field of c_nvmlValue_t that holds a sample's value.
_SAMPLE_VALUE_FIELDS = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}
# Events read per sample at most: a storm must not hold up the readings.
_MAX_EVENTS_PER_SAMPLE = 256

# Error codes meaning "this particular value is unavailable", not "the GPU is
# broken": the query is unsupported on this model/driver, or we lack the
# permission. Any other NVML error on a device call marks the GPU unhealthy.
_VALUE_UNAVAILABLE_CODES: frozenset[int] = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_NOT_FOUND,
        pynvml.NVML_ERROR_INVALID_ARGUMENT,
        pynvml.NVML_ERROR_INSUFFICIENT_SIZE,
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    }
)


# The readings the scheduler decides with: unread, the GPU is unknown, not free.
DECIDING_READINGS = (READING_MEMORY, READING_UTILISATION, READING_PROCESSES)


def _text(value: object) -> str:
    """Old bindings return bytes, new ones str."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def describe_nvml_error(exc: BaseException) -> str:
    """``NVMLError_GpuIsLost: GPU is lost`` - class name first, because it is
    what people search for."""
    try:
        text = str(exc)
    except Exception:  # str() of NVMLError may itself call into NVML
        text = repr(exc)
    return f"{type(exc).__name__}: {text}"


class _GpuHealth:
    """What went wrong while reading one GPU: the first health problem (the GPU is
    sick) and the deciding readings it could not give, with why (the GPU is unknown)."""

    def __init__(self) -> None:
        self.message: str | None = None
        self.unread: dict[str, str] = {}

    @property
    def healthy(self) -> bool:
        return self.message is None


class _HealthHysteresis:
    """One GPU's health over its readings: unhealthy after `unhealthy_after` bad readings
    in a row (or at once for an XID), healthy again after `healthy_after` good ones."""

    def __init__(self, *, unhealthy_after: int, healthy_after: int) -> None:
        self.unhealthy_after = max(1, unhealthy_after)
        self.healthy_after = max(1, healthy_after)
        self.healthy = True
        self.bad = self.good = 0
        self.problem: str | None = None

    def observe(self, problem: str | None, *, at_once: bool = False) -> tuple[bool, str | None]:
        """The verdict after one more reading (`problem` None: a good one), with what to
        show: the problem, and how far the count has gone while it is not decided."""
        if problem is not None:
            self.good = 0
            self.bad += 1
            self.problem = problem
            if self.healthy and (at_once or self.bad >= self.unhealthy_after):
                self.healthy = False
            if self.healthy:
                return True, f"{problem} ({self.bad} of {self.unhealthy_after} bad readings)"
            return False, problem
        self.bad = 0
        if self.healthy:
            return True, None
        self.good += 1
        if self.good >= self.healthy_after:
            self.healthy, self.good, self.problem = True, 0, None
            return True, None
        return (
            False,
            f"{self.problem} (recovering: {self.good} of {self.healthy_after} good readings)",
        )


class NvmlGpuBackend:
    """:class:`~workers.agent.gpu_backend.GpuBackend` over NVML.

    Raises :class:`BackendUnavailable` from the constructor when NVML cannot
    be initialised (no driver, no library); after that, nothing raises.
    """

    def __init__(
        self,
        nvml: Any = pynvml,
        *,
        hostname: str | None = None,
        clock: Callable[[], float] = time.time,
        unhealthy_after: int = UNHEALTHY_AFTER,
        healthy_after: int = HEALTHY_AFTER,
    ) -> None:
        self._nvml = nvml
        self._clock = clock
        self._hostname = hostname or socket.gethostname()
        self._closed = False
        # Any failure here (NVMLError, or an OSError from a broken
        # libnvidia-ml) means "no usable NVML": the caller may fall back.
        try:
            nvml.nvmlInit()
        except Exception as exc:
            raise BackendUnavailable(describe_nvml_error(exc)) from exc
        self._events: Any = None
        # Per GPU, the driver's timestamp (µs) of the last utilisation sample read.
        self._util_seen: dict[int, int] = {}
        try:
            self._info, self._handles = self._discover()
        except Exception as exc:
            self._shutdown()
            raise BackendUnavailable(describe_nvml_error(exc)) from exc
        self._health = {
            gpu.index: _HealthHysteresis(
                unhealthy_after=unhealthy_after, healthy_after=healthy_after
            )
            for gpu in self._info.gpus
        }
        self._events = self._watch_xid_events()

    # -- static facts -------------------------------------------------------

    def _discover(self) -> tuple[NodeInfo, list[Any | None]]:
        nvml = self._nvml
        count = int(nvml.nvmlDeviceGetCount())  # failure here: NVML is unusable
        driver = self._call(nvml.nvmlSystemGetDriverVersion)
        handles: list[Any | None] = []
        statics: list[GpuStatic] = []
        for index in range(count):
            health = _GpuHealth()
            handle = self._call(nvml.nvmlDeviceGetHandleByIndex, index, health=health)
            handles.append(handle)
            uuid = model = minor = None
            memory_total_mb = 0
            if handle is not None:
                uuid = self._call(nvml.nvmlDeviceGetUUID, handle, health=health)
                model = self._call(nvml.nvmlDeviceGetName, handle, health=health)
                memory = self._call(nvml.nvmlDeviceGetMemoryInfo, handle, health=health)
                if memory is not None:
                    memory_total_mb = int(memory.total) // _MIB
                get_minor = getattr(nvml, "nvmlDeviceGetMinorNumber", None)
                minor = self._call(get_minor, handle) if get_minor is not None else None
            if not health.healthy:
                logger.warning("GPU %d unreadable at start-up: %s", index, health.message)
            statics.append(
                GpuStatic(
                    index=index,
                    # A placeholder keeps the index reportable (as unhealthy)
                    # instead of making the whole GPU vanish from the node.
                    uuid=_text(uuid) if uuid is not None else f"{UNREADABLE_UUID}{index}",
                    model=_text(model) if model is not None else "unknown",
                    memory_total_mb=memory_total_mb,
                    device_minor=int(minor) if minor is not None else index,
                )
            )
        peers = self._nvlink_peers(handles)
        statics = [replace(g, nvlink_peers=peers.get(g.index, ())) for g in statics]
        info = NodeInfo(
            hostname=self._hostname,
            driver_version=_text(driver) if driver is not None else None,
            gpus=tuple(statics),
            backend="nvml",
        )
        return info, handles

    def _nvlink_peers(self, handles: list[Any | None]) -> dict[int, tuple[int, ...]]:
        """NVLink reachability between this node's GPUs.

        Preferred: the P2P status query, which also covers NVSwitch systems
        (where every link's remote end is a switch, not a GPU). Fallback: walk
        each active link and match its remote PCI bus id to a local GPU.
        """
        nvml = self._nvml
        peers: dict[int, set[int]] = {i: set() for i in range(len(handles))}
        p2p_query = getattr(nvml, "nvmlDeviceGetP2PStatus", None)
        nvlink_index = getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", 2)
        status_ok = getattr(nvml, "NVML_P2P_STATUS_OK", 0)
        p2p_answered = False
        if p2p_query is not None:
            for i, first in enumerate(handles):
                for j, second in enumerate(handles):
                    if j <= i or first is None or second is None:
                        continue
                    status = self._call(p2p_query, first, second, nvlink_index)
                    if status is None:
                        continue
                    p2p_answered = True
                    if status == status_ok:
                        peers[i].add(j)
                        peers[j].add(i)
        if not p2p_answered:
            self._nvlink_peers_from_links(handles, peers)
        return {i: tuple(sorted(found)) for i, found in peers.items()}

    def _nvlink_peers_from_links(
        self, handles: list[Any | None], peers: dict[int, set[int]]
    ) -> None:
        nvml = self._nvml
        if not hasattr(nvml, "nvmlDeviceGetNvLinkState"):
            return
        bus_to_index: dict[str, int] = {}
        for index, handle in enumerate(handles):
            if handle is None:
                continue
            pci = self._call(nvml.nvmlDeviceGetPciInfo, handle)
            if pci is not None:
                bus_to_index[_normalize_bus_id(pci.busId)] = index
        max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
        for index, handle in enumerate(handles):
            if handle is None:
                continue
            for link in range(max_links):
                # Unsupported / invalid link number: no (more) links on this GPU.
                active = self._call(nvml.nvmlDeviceGetNvLinkState, handle, link)
                if active is None:
                    break
                if not active:
                    continue
                remote = self._call(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
                if remote is None:
                    continue
                peer = bus_to_index.get(_normalize_bus_id(remote.busId))
                if peer is not None and peer != index:
                    peers[index].add(peer)
                    peers[peer].add(index)

    def node_info(self) -> NodeInfo:
        return self._info

    # -- readings -----------------------------------------------------------

    def sample(self) -> NodeSample:
        taken_at = self._clock()
        xids = self._critical_xids()
        everywhere = xids.pop(None, [])
        samples = tuple(
            self._judge(self._sample_gpu(gpu), [*everywhere, *xids.get(gpu.index, [])])
            for gpu in self._info.gpus
        )
        return NodeSample(taken_at=taken_at, gpus=samples)

    def _judge(self, reading: GpuSample, xids: list[int]) -> GpuSample:
        """The GPU's health after this reading, through its hysteresis."""
        problem = None if reading.healthy else reading.health_message or "unhealthy"
        if xids:
            problem = f"XID {', '.join(str(x) for x in xids)} (critical XID event from the driver)"
        healthy, message = self._health[reading.index].observe(problem, at_once=bool(xids))
        return replace(reading, healthy=healthy, health_message=message)

    # -- XID events -----------------------------------------------------------

    def _watch_xid_events(self) -> Any:
        """An event set with every GPU registered for critical XID events, or None where
        the driver offers none (then health comes from the readings alone)."""
        nvml = self._nvml
        xid_type = getattr(nvml, "nvmlEventTypeXidCriticalError", None)
        if xid_type is None or not hasattr(nvml, "nvmlEventSetCreate"):
            return None
        try:
            events = nvml.nvmlEventSetCreate()
        except Exception as exc:
            logger.info("no XID events on this node: %s", describe_nvml_error(exc))
            return None
        watched = 0
        for gpu in self._info.gpus:
            handle = self._handles[gpu.index]
            if handle is None:
                continue
            try:
                nvml.nvmlDeviceRegisterEvents(handle, xid_type, events)
                watched += 1
            except Exception as exc:
                logger.info("GPU %d gives no XID events: %s", gpu.index, describe_nvml_error(exc))
        if watched:
            return events
        self._free_events(events)
        return None

    def _critical_xids(self) -> dict[int | None, list[int]]:
        """XIDs of the GPU's own faults since the last sample, per GPU index (None: the
        driver named no GPU, so every one), application XIDs left out."""
        nvml = self._nvml
        found: dict[int | None, list[int]] = {}
        if self._events is None:
            return found
        xid_type = int(nvml.nvmlEventTypeXidCriticalError)
        timeout = getattr(nvml, "NVML_ERROR_TIMEOUT", 10)
        for _ in range(_MAX_EVENTS_PER_SAMPLE):
            try:
                event = nvml.nvmlEventSetWait(self._events, 0)
            except Exception as exc:
                if getattr(exc, "value", None) != timeout:
                    logger.warning("reading XID events: %s", describe_nvml_error(exc))
                break
            if not int(event.eventType) & xid_type:
                continue
            xid = int(event.eventData)
            if xid in APPLICATION_XIDS:
                continue
            found.setdefault(self._index_of(event.device), []).append(xid)
        return found

    def _index_of(self, device: Any) -> int | None:
        """The index of the GPU an event names: by its handle, else by its UUID; None
        when it names none (a NULL device) or one we cannot tell."""
        if not device:
            return None
        for index, handle in enumerate(self._handles):
            if handle is not None and _same_device(handle, device):
                return index
        uuid = self._call(self._nvml.nvmlDeviceGetUUID, device)
        if uuid is None:
            return None
        return next((g.index for g in self._info.gpus if g.uuid == _text(uuid)), None)

    def _free_events(self, events: Any) -> None:
        try:
            self._nvml.nvmlEventSetFree(events)
        except Exception as exc:  # closing must not fail the agent's shutdown
            logger.debug("nvmlEventSetFree failed: %s", exc)

    def _sample_gpu(self, gpu: GpuStatic) -> GpuSample:
        try:
            return self._read_gpu(gpu)
        except Exception as exc:  # last line of defence: a bug must not stop the agent
            logger.exception("unexpected error reading GPU %d", gpu.index)
            return _unreadable(gpu, f"unexpected error reading GPU: {describe_nvml_error(exc)}")

    def _read_gpu(self, gpu: GpuStatic) -> GpuSample:
        nvml = self._nvml
        health = _GpuHealth()
        handle = self._handles[gpu.index]
        if handle is None:
            # It failed at start-up; it may have come back (e.g. after a reset).
            handle = self._call(nvml.nvmlDeviceGetHandleByIndex, gpu.index, health=health)
            if handle is None:
                return _unreadable(gpu, health.message or "no NVML handle for this GPU")
            self._handles[gpu.index] = handle

        def read(fn: Callable[..., T], *args: Any, reading: str | None = None) -> T | None:
            # Once the GPU is known to be broken, further calls only add latency
            # (each can take seconds on a lost GPU) and say nothing new.
            if not health.healthy:
                if reading is not None:
                    health.unread[reading] = f"not read after {health.message}"
                return None
            return self._call(fn, handle, *args, health=health, reading=reading)

        memory = read(nvml.nvmlDeviceGetMemoryInfo, reading=READING_MEMORY)
        utilization = read(nvml.nvmlDeviceGetUtilizationRates, reading=READING_UTILISATION)
        util_sm_pct = float(utilization.gpu) if utilization is not None else None
        sampled = self._utilisation_since_last(gpu.index, handle) if health.healthy else None
        if sampled is not None:
            util_sm_pct = sampled
            health.unread.pop(READING_UTILISATION, None)
        sensor = getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
        # The versioned call where the driver has it (the old one goes with CUDA 14).
        get_temperature_v = getattr(nvml, "nvmlDeviceGetTemperatureV", None)
        temperature = read(get_temperature_v, sensor) if get_temperature_v is not None else None
        if temperature is None and hasattr(nvml, "nvmlDeviceGetTemperature"):
            temperature = read(nvml.nvmlDeviceGetTemperature, sensor)
        power_mw = read(nvml.nvmlDeviceGetPowerUsage)
        processes = read(self._processes, reading=READING_PROCESSES)
        mig_enabled = self._mig_enabled(handle, health) if health.healthy else False
        get_remapped = getattr(nvml, "nvmlDeviceGetRemappedRows", None)
        remapped = read(get_remapped) if get_remapped is not None else None
        if remapped is not None and health.healthy:
            _corrected, uncorrected, pending, failed = remapped
            if failed:
                health.message = (
                    f"row remapping failed ({uncorrected} rows remapped for uncorrectable "
                    "errors): the GPU needs replacing (nvmlDeviceGetRemappedRows)"
                )
            elif pending:
                health.message = (
                    "row remapping pending: the GPU needs a reset (nvmlDeviceGetRemappedRows)"
                )
        if health.healthy:
            fabric_problem = self._fabric_problem(handle)
            if fabric_problem is not None:
                health.message = fabric_problem
        return GpuSample(
            index=gpu.index,
            uuid=gpu.uuid,
            healthy=health.healthy,
            health_message=health.message,
            util_sm_pct=util_sm_pct,
            util_mem_pct=float(utilization.memory) if utilization is not None else None,
            memory_used_mb=int(memory.used) // _MIB if memory is not None else None,
            memory_free_mb=int(memory.free) // _MIB if memory is not None else None,
            temperature_c=float(temperature) if temperature is not None else None,
            power_w=float(power_mw) / 1000.0 if power_mw is not None else None,
            processes=tuple(processes or ()),
            unread=dict(health.unread),
            mig_enabled=mig_enabled,
        )

    def _fabric_problem(self, handle: Any) -> str | None:
        """On NVSwitch systems (HGX H100/H200) a GPU is usable by CUDA only once the fabric
        manager has trained its fabric and registered it; before that, or when that failed,
        CUDA fails to start on it. GPUs without a fabric (PCIe, or a driver without the
        call) answer NOT_SUPPORTED, or report the state NOT_SUPPORTED: nothing to judge."""
        nvml = self._nvml
        get_fabric = getattr(nvml, "nvmlDeviceGetGpuFabricInfo", None)
        info_type = getattr(nvml, "c_nvmlGpuFabricInfo_t", None)
        if get_fabric is None or info_type is None:
            return None
        info = info_type()
        try:
            get_fabric(handle, ctypes.byref(info))  # by reference: by value, NVML segfaults
        except Exception:  # NOT_SUPPORTED, FUNCTION_NOT_FOUND: no fabric to wait for
            return None
        state = int(info.state)
        if state == _FABRIC_STATE_NOT_SUPPORTED:
            return None
        if state != _FABRIC_STATE_COMPLETED:
            stage = "not started" if state == _FABRIC_STATE_NOT_STARTED else "in progress"
            return (
                f"NVLink fabric registration {stage}: CUDA cannot use the GPU until the "
                "fabric manager completes it (nvmlDeviceGetGpuFabricInfo)"
            )
        if int(info.status) != 0:  # NVML_SUCCESS
            why = describe_nvml_error(nvml.NVMLError(int(info.status)))
            return (
                f"NVLink fabric registration failed ({why}): check nvidia-fabricmanager "
                "(nvmlDeviceGetGpuFabricInfo)"
            )
        return None

    def _utilisation_since_last(self, index: int, handle: Any) -> float | None:
        """Mean utilisation over the driver's samples (about 6 a second) taken since the
        last reading, so a bursty process between two readings is seen; None where the
        driver keeps no samples or has none new (the snapshot call answers then)."""
        nvml = self._nvml
        get_samples = getattr(nvml, "nvmlDeviceGetSamples", None)
        kind = getattr(nvml, "NVML_GPU_UTILIZATION_SAMPLES", None)
        if get_samples is None or kind is None:
            return None
        since = self._util_seen.get(index, 0)
        try:
            value_type, samples = get_samples(handle, kind, since)
        except Exception:  # NOT_FOUND: none since; NOT_SUPPORTED: no sampling here
            return None
        field_name = _SAMPLE_VALUE_FIELDS.get(int(value_type), "uiVal")
        fresh = [(int(x.timeStamp), getattr(x.sampleValue, field_name)) for x in samples or ()]
        fresh = [(at, value) for at, value in fresh if at > since]
        if not fresh:
            return None
        self._util_seen[index] = max(at for at, _ in fresh)
        mean = sum(float(value) for _, value in fresh) / len(fresh)
        return min(100.0, max(0.0, mean))

    def _mig_enabled(self, handle: Any, health: _GpuHealth) -> bool:
        """Whether MIG mode is on (now, not pending a reset). A GPU that cannot do MIG
        says NOT_SUPPORTED: off. Any other failure leaves the mode unknown."""
        nvml = self._nvml
        get_mode = getattr(nvml, "nvmlDeviceGetMigMode", None)
        if get_mode is None:
            return False
        try:
            current, _pending = get_mode(handle)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) in (
                getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3),
                getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13),
            ):
                return False
            health.unread[READING_MIG_MODE] = (
                f"{describe_nvml_error(exc)} (in nvmlDeviceGetMigMode)"
            )
            return False
        return bool(current == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1))

    def _processes(self, handle: Any) -> list[GpuProcess]:
        """Every process with a context on the GPU: compute, MPS clients (listed apart,
        and only there) and graphics, one entry per pid. The compute list must answer;
        the others may be unsupported (older drivers, no MPS daemon), which lists none."""
        by_pid = {proc.pid: proc for proc in self._compute_processes(handle)}
        absent = {
            getattr(self._nvml, "NVML_ERROR_NOT_SUPPORTED", 3),
            getattr(self._nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13),
        }
        for query in (
            "nvmlDeviceGetMPSComputeRunningProcesses",
            "nvmlDeviceGetGraphicsRunningProcesses",
        ):
            if not hasattr(self._nvml, query):
                continue
            try:
                listed = self._process_list(query, handle)
            except self._nvml.NVMLError as exc:
                if getattr(exc, "value", None) in absent:
                    continue
                raise
            for proc in listed:
                known = by_pid.get(proc.pid)
                # One process in two lists is one context: its memory counts once.
                if known is None or (known.used_memory_mb or 0) < (proc.used_memory_mb or 0):
                    by_pid[proc.pid] = proc
        return list(by_pid.values())

    def _compute_processes(self, handle: Any) -> list[GpuProcess]:
        return self._process_list("nvmlDeviceGetComputeRunningProcesses", handle)

    def _process_list(self, query: str, handle: Any) -> list[GpuProcess]:
        nvml = self._nvml
        mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
        try:
            raw = getattr(nvml, query)(handle)
        except Exception as exc:
            # Older drivers lack the v3 entry point the unversioned wrapper uses.
            if mismatch is None or not isinstance(exc, mismatch):
                raise
            raw = getattr(nvml, f"{query}_v2")(handle)
        result = []
        for proc in raw or ():
            used = getattr(proc, "usedGpuMemory", None)
            used_mb = int(used) // _MIB if used is not None else None
            result.append(GpuProcess(pid=int(proc.pid), used_memory_mb=used_mb))
        return result

    def reports_local_pids(self, *, cuda: Any = None) -> bool | None:
        """Whether NVML names GPU processes by their PID in this process's namespace:
        open a CUDA context (the driver's libcuda) and look for our own PID in NVML's
        lists. Recent drivers translate PIDs into the caller's namespace; older ones report
        the host's (NVIDIA/nvidia-docker#1483). None: cannot tell (no libcuda, no GPU)."""
        try:
            lib = cuda if cuda is not None else ctypes.CDLL("libcuda.so.1")
        except OSError:
            return None
        device, context = ctypes.c_int(), ctypes.c_void_p()
        if lib.cuInit(0) != 0 or lib.cuDeviceGet(ctypes.byref(device), 0) != 0:
            return None
        if lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) != 0:
            return None
        try:
            seen = {
                proc.pid
                for handle in self._handles
                if handle is not None
                for proc in self._compute_processes(handle)
            }
        except Exception:
            return None
        finally:
            lib.cuDevicePrimaryCtxRelease(device)
        if not seen:
            return None
        return os.getpid() in seen

    def _call(
        self,
        fn: Callable[..., T],
        *args: Any,
        health: _GpuHealth | None = None,
        reading: str | None = None,
    ) -> T | None:
        """Call NVML; on error return None and, unless the error only means
        "value unavailable", record it as the GPU's health problem. A deciding
        `reading` that fails, for whatever reason, is recorded as unread: the
        scheduler must not take "could not read" for "nothing there"."""
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            name = getattr(fn, "__name__", "NVML call")
            if health is not None and reading is not None:
                health.unread[reading] = f"{describe_nvml_error(exc)} (in {name})"
            if code not in _VALUE_UNAVAILABLE_CODES and health is not None and health.healthy:
                health.message = f"{describe_nvml_error(exc)} (in {name})"
            return None

    # -- lifecycle ----------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._shutdown()

    def _shutdown(self) -> None:
        if self._events is not None:
            self._free_events(self._events)
            self._events = None
        try:
            self._nvml.nvmlShutdown()
        except Exception as exc:  # closing must not fail the agent's shutdown
            logger.debug("nvmlShutdown failed: %s", exc)


def _same_device(first: Any, second: Any) -> bool:
    """Two NVML device handles name one GPU: equal, or (ctypes pointers, which compare
    by identity) pointing at the same address."""
    if first == second:
        return True
    try:
        return bool(
            ctypes.cast(first, ctypes.c_void_p).value == ctypes.cast(second, ctypes.c_void_p).value
        )
    except (ctypes.ArgumentError, TypeError):
        return False


def _normalize_bus_id(bus_id: object) -> str:
    # NVML pads the PCI domain differently across calls ("00000000:3B:00.0"
    # vs "0000:3B:00.0"); compare on the last three parts.
    text = _text(bus_id).strip().upper()
    parts = text.split(":")
    if len(parts) >= 2:
        text = ":".join(parts[-2:])
    return text


def _unreadable(gpu: GpuStatic, message: str) -> GpuSample:
    return GpuSample(
        index=gpu.index,
        uuid=gpu.uuid,
        healthy=False,
        health_message=message,
        util_sm_pct=None,
        util_mem_pct=None,
        memory_used_mb=None,
        memory_free_mb=None,
        temperature_c=None,
        power_w=None,
        processes=(),
        unread=dict.fromkeys(DECIDING_READINGS, message),
    )
