"""On a machine with NVIDIA GPUs, through the real NVML: the backend reads each GPU, and
the agent tells its own jobs' CUDA processes from foreign ones (torchrun's workers, in
sessions of their own, included), which is what the scheduler's foreign-load filter and
free-memory readings rest on; and a job can open only the GPUs it was given.

Skipped where NVML does not work (CI has no GPU). The CUDA processes need PyTorch with
CUDA in this interpreter; run with `pytest --noconftest tests/agent/test_agent_real_gpu.py`
where the service's other dependencies are not installed (the GPU machine).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.wire import GpuReading, attempt_log_path
from tests.agent.support import RecordingReporter, installation_of, run, stop
from workers.agent.fence import host_pid_namespace_problem, in_host_pid_namespace
from workers.agent.gpu_backend import BackendUnavailable
from workers.agent.nvml_backend import NvmlGpuBackend
from workers.agent.service import Agent, AgentSettings

# Holds argv[1] MiB of GPU memory for argv[2] seconds, saying when it has them.
CUDA_HOLDER = (
    "import sys, time, torch; "
    "x = torch.empty(int(sys.argv[1]) * 2**20, dtype=torch.uint8, device='cuda'); "
    "torch.cuda.synchronize(); print('holding', flush=True); time.sleep(float(sys.argv[2]))"
)


@pytest.fixture(scope="module")
def backend() -> Iterator[NvmlGpuBackend]:
    try:
        opened = NvmlGpuBackend()
    except BackendUnavailable as exc:
        pytest.skip(f"no working NVML here: {exc}")
    yield opened
    opened.close()


def _until(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_nvml_reads_every_gpu(backend: NvmlGpuBackend) -> None:
    info = backend.node_info()
    sample = backend.sample()
    print(f"\ndriver {info.driver_version}, {len(info.gpus)} GPU(s)")
    assert info.gpus and [g.index for g in sample.gpus] == [g.index for g in info.gpus]
    for static, live in zip(info.gpus, sample.gpus, strict=True):
        print(f"  {static}\n  {live}")
        assert static.uuid.startswith("GPU-") and static.uuid == live.uuid
        assert static.model and static.memory_total_mb > 1024
        assert live.healthy, live.health_message
        assert live.util_sm_pct is not None and 0 <= live.util_sm_pct <= 100
        assert live.memory_used_mb is not None and live.memory_free_mb is not None
        assert live.memory_used_mb + live.memory_free_mb <= static.memory_total_mb + 1
        assert live.temperature_c is not None and 0 < live.temperature_c < 120
        assert live.power_w is not None and live.power_w > 0
        assert not live.unread, live.unread  # every reading placement decides with
        assert not live.mig_enabled  # the check machines run whole GPUs


def test_the_newer_nvml_calls_answer_here(backend: NvmlGpuBackend) -> None:
    """What issue 39's backend relies on, against the real driver: the versioned
    temperature, utilisation samples, remapped rows, MIG mode and XID events."""
    import pynvml

    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    sensor = pynvml.NVML_TEMPERATURE_GPU
    versioned = pynvml.nvmlDeviceGetTemperatureV(handle, sensor)
    assert abs(versioned - pynvml.nvmlDeviceGetTemperature(handle, sensor)) <= 3
    value_type, samples = pynvml.nvmlDeviceGetSamples(
        handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0
    )
    print(f"\n{len(samples)} utilisation samples, value type {value_type}")
    assert samples and all(0 <= s.sampleValue.uiVal <= 100 for s in samples)  # percent
    corrected, uncorrected, pending, failed = pynvml.nvmlDeviceGetRemappedRows(handle)
    assert not pending and not failed, (corrected, uncorrected)
    current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    assert current == pynvml.NVML_DEVICE_MIG_DISABLE
    assert backend._events is not None  # registered for critical XID events
    assert backend._critical_xids() == {}  # none on a healthy GPU


def test_a_jobs_cuda_process_is_told_from_a_foreign_one(
    backend: NvmlGpuBackend, tmp_path: Path
) -> None:
    if subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                      capture_output=True).returncode:  # fmt: skip
        pytest.skip("no PyTorch with CUDA in this interpreter to start GPU processes")
    before = backend.sample().gpus[0].memory_used_mb or 0
    # Foreign: a process on GPU 0 the agent did not start (another user's notebook).
    foreign = subprocess.Popen(
        [sys.executable, "-c", CUDA_HOLDER, "1024", "60"], stdout=subprocess.PIPE, text=True
    )
    agent = _agent(backend, tmp_path)
    try:
        assert foreign.stdout is not None and foreign.stdout.readline().strip() == "holding"
        command = [sys.executable, "-c", CUDA_HOLDER, "2048", "60"]
        assert run(
            agent, node="gpu-node", job_id=7, attempt=1, gpu_indices=(0,), command=command
        ) == ("started")
        log = attempt_log_path(tmp_path / "logs", 7, 1, 0)
        _until("the job to hold its GPU memory", lambda: "holding" in _text(log))

        def both_seen() -> GpuReading | None:
            gpu = agent.heartbeat(backend.sample()).gpus[0]
            owners = {p.job_id for p in gpu.processes}
            return gpu if {7, None} <= owners else None

        gpu = _until("both processes in NVML's list, told apart", both_seen, timeout=30)
        print(f"\nGPU 0 with a job and a foreign process: {gpu}")
        mine = [p for p in gpu.processes if p.job_id == 7]
        theirs = [p for p in gpu.processes if p.job_id is None]
        assert sum(p.used_memory_mb or 0 for p in mine) >= 2048
        assert any(p.pid == foreign.pid for p in theirs), (foreign.pid, theirs)
        assert gpu.foreign_memory_mb >= 1024  # what the scheduler's filter reads
        assert (gpu.memory_used_mb or 0) >= before + 3072
    finally:
        foreign.kill()
        foreign.wait()
        stop(agent, node="gpu-node", job_id=7, attempt=1, reason="cancel", grace_s=0)
        _until("the job to end", lambda: agent.running_count() == 0, timeout=30)


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _agent(backend: NvmlGpuBackend, tmp_path: Path) -> Agent:
    return Agent(
        settings=AgentSettings(
            name="gpu-node", grace_s=1.0, installation=installation_of(tmp_path),
            uid0_accounts="root",
        ),
        backend=backend,
        reporter=RecordingReporter(),
        log_dir=tmp_path / "logs",
        log_cap_bytes=100_000,
        state_dir=tmp_path / "state",
    )  # fmt: skip


def _needs_torch() -> None:
    if subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                      capture_output=True).returncode:  # fmt: skip
        pytest.skip("no PyTorch with CUDA in this interpreter to start GPU processes")


# Each torchrun worker holds argv[1] MiB on the job's GPU (both share GPU 0 here).
WORKER = (
    "import os, sys, time, torch; "
    "x = torch.empty(int(sys.argv[1]) * 2**20, dtype=torch.uint8, device='cuda'); "
    "torch.cuda.synchronize(); "
    "print('worker', os.environ['LOCAL_RANK'], os.getpid(), os.getsid(0), flush=True); "
    "time.sleep(60)"
)


def test_nvml_speaks_this_pid_namespace_or_the_agent_refuses(backend: NvmlGpuBackend) -> None:
    answer = backend.reports_local_pids()
    host = in_host_pid_namespace()
    print(f"\nin the host's PID namespace: {host}; NVML lists our own CUDA context: {answer}")
    problem = host_pid_namespace_problem("nvml", local_pids=backend.reports_local_pids)
    assert (problem is None) == (host or bool(answer)), problem


def test_torchrun_workers_are_attributed_to_their_job(
    backend: NvmlGpuBackend, tmp_path: Path
) -> None:
    _needs_torch()
    script = tmp_path / "worker.py"
    script.write_text(WORKER.replace("; ", "\n"))
    agent = _agent(backend, tmp_path)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", "2", str(script), "1024"]  # fmt: skip
    try:
        assert run(agent, job_id=8, attempt=1, gpu_indices=(0,), command=tuple(torchrun),
                   workdir=str(tmp_path)) == "started"  # fmt: skip
        log = attempt_log_path(tmp_path / "logs", 8, 1, 0)
        workers = _until(
            "both workers to hold their memory",
            lambda: (
                (
                    w := [
                        line.split()
                        for line in _text(log).splitlines()
                        if line.startswith("worker ")
                    ]
                )
                and len(w) == 2
                and w
            ),
            timeout=120,
        )
        pids = {int(w[2]) for w in workers}
        sessions = {int(w[3]) for w in workers}
        print(f"\ntorchrun workers {pids}, sessions {sessions}; agent's job pid "
              f"{agent._running[(8, 1)].process.pid}")  # fmt: skip

        def attributed() -> GpuReading | None:
            gpu = agent.heartbeat(backend.sample()).gpus[0]
            seen = {p.pid: p.job_id for p in gpu.processes}
            return gpu if pids <= set(seen) else None

        gpu = _until("the workers in NVML's list", attributed, timeout=30)
        print(f"GPU 0 with a 2-worker torchrun job: {gpu}")
        owners = {p.pid: p.job_id for p in gpu.processes}
        assert all(owners[pid] == 8 for pid in pids), owners
        assert gpu.foreign_memory_mb < 1024  # their 2 GiB are the job's, not foreign
    finally:
        stop(agent, job_id=8, attempt=1, grace_s=0)
        _until("the job to end", lambda: agent.running_count() == 0, timeout=30)


PROBE = (
    "import os, torch; fd = None\n"
    "try: fd = os.open('/dev/nvidia0', os.O_RDWR)\n"
    "except OSError as e: print('open', e.errno)\n"
    "else: print('open ok')\n"
    "print('cuda', torch.cuda.is_available() and torch.cuda.device_count())"
)


def test_a_job_can_open_only_the_gpus_it_was_given(backend: NvmlGpuBackend, tmp_path: Path) -> None:
    _needs_torch()
    agent = _agent(backend, tmp_path)
    if not agent.fence.fences_devices or not agent.gpu_devices:
        pytest.skip(f"{agent.fence.isolation}: no device fence on this host")
    print(f"\nfence {agent.fence.isolation}; GPU device files {agent.gpu_devices}")
    for job_id, gpus in ((9, (0,)), (10, ())):  # its GPU; none (a CPU job)
        command = (sys.executable, "-c", PROBE)
        assert run(agent, job_id=job_id, attempt=1, gpu_indices=gpus, command=command) == "started"
        _until(f"job {job_id} to end", lambda: agent.running_count() == 0, timeout=60)
    given = _text(attempt_log_path(tmp_path / "logs", 9, 1, 0))
    denied = _text(attempt_log_path(tmp_path / "logs", 10, 1, 0))
    print(f"given GPU 0: {given!r}\ngiven none: {denied!r}")
    assert "open ok" in given and "cuda 1" in given
    assert "open 1" in denied  # EPERM: the devices fence, not the driver
    assert "cuda 1" not in denied
