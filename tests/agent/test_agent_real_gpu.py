"""On a machine with NVIDIA GPUs, through the real NVML: the backend reads each GPU, and
the agent tells its own jobs' CUDA processes from foreign ones, which is what the
scheduler's foreign-load filter and free-memory readings rest on.

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
from tests.agent.support import RecordingReporter, run, stop
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
    agent = Agent(
        settings=AgentSettings(name="gpu-node", grace_s=1.0),
        backend=backend,
        reporter=RecordingReporter(),
        log_dir=tmp_path / "logs",
        log_cap_bytes=100_000,
        state_dir=tmp_path / "state",
    )
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
