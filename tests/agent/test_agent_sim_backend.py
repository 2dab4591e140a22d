"""Simulated GPUs: readings follow attached jobs; injected faults show up like real ones."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from workers.agent.gpu_backend import (
    GpuBackend,
    GpuSample,
    SimSpec,
    open_backend,
    parse_sim_spec,
)
from workers.agent.sim_backend import (
    SimInjectedState,
    SimulatedGpus,
    load_sim_state,
    save_sim_state,
)

H100_MB = 81559


def fixed_clock() -> float:
    return 1_700_000_000.0


def sim(count: int = 4, model: str = "H100-80GB", **kwargs: object) -> SimulatedGpus:
    return SimulatedGpus(count, model, seed=7, hostname="node-a", clock=fixed_clock, **kwargs)  # type: ignore[arg-type]


def gpu(backend: GpuBackend, index: int) -> GpuSample:
    return backend.sample().gpus[index]


def test_node_info_describes_the_simulated_gpus() -> None:
    backend = sim(8)
    info = backend.node_info()
    assert isinstance(backend, GpuBackend)
    assert (info.hostname, info.backend, len(info.gpus)) == ("node-a", "sim", 8)
    assert all(g.model == "H100-80GB" and g.memory_total_mb == H100_MB for g in info.gpus)
    assert [g.index for g in info.gpus] == list(range(8))
    assert len({g.uuid for g in info.gpus}) == 8
    assert all(g.uuid.startswith("GPU-") for g in info.gpus)
    assert info.gpus[3].nvlink_peers == (0, 1, 2, 4, 5, 6, 7)  # NVSwitch: all-to-all
    # Same hostname and seed: same UUIDs (an agent restart keeps GPU identity).
    assert sim(8).node_info() == info
    assert SimulatedGpus(8, "H100-80GB", seed=8, hostname="node-a").node_info().gpus[0].uuid != (
        info.gpus[0].uuid
    )


def test_pcie_models_have_no_nvlink_and_memory_follows_the_model() -> None:
    info = SimulatedGpus(2, "L4").node_info()
    assert all(g.nvlink_peers == () and g.memory_total_mb == 23034 for g in info.gpus)
    assert SimulatedGpus(1, "RTX-24GB").node_info().gpus[0].memory_total_mb == 24 * 1024


def test_idle_gpus_read_idle() -> None:
    reading = gpu(sim(), 0)
    assert reading.healthy and reading.health_message is None
    assert (reading.util_sm_pct, reading.memory_used_mb, reading.memory_free_mb) == (0, 0, H100_MB)
    assert reading.power_w == 70.0
    assert reading.temperature_c == 30.0
    assert reading.processes == ()


def test_readings_follow_attached_jobs_and_release_on_detach() -> None:
    backend = sim()
    backend.attach_job(1234, [0, 1])
    backend.attach_job("job-9", [2], share=0.5, memory_mb=10_000)
    sample = backend.sample()
    for index in (0, 1):
        reading = sample.gpus[index]
        assert reading.util_sm_pct is not None and 85 <= reading.util_sm_pct <= 95
        assert reading.memory_used_mb == int(H100_MB * 0.6)
        assert reading.memory_free_mb == H100_MB - int(H100_MB * 0.6)
        assert reading.power_w is not None and 600 <= reading.power_w <= 700
        assert reading.temperature_c is not None and reading.temperature_c > 65
        assert [p.pid for p in reading.processes] == [1234]
    shared = sample.gpus[2]
    assert shared.util_sm_pct is not None and 40 <= shared.util_sm_pct <= 50
    assert shared.memory_used_mb == 10_000
    assert [p.pid for p in shared.processes] == [SimulatedGpus.pid_for("job-9")]
    assert SimulatedGpus.pid_for("job-9") > 4_194_304  # above any real pid
    assert sample.gpus[3].util_sm_pct == 0

    backend.detach_job(1234)
    backend.detach_job("job-9")
    backend.detach_job("never-attached")  # idempotent
    after = backend.sample()
    assert all(r.util_sm_pct == 0 and r.memory_used_mb == 0 for r in after.gpus)
    assert all(r.processes == () for r in after.gpus)


def test_same_seed_same_readings() -> None:
    first, second = sim(), sim()
    for backend in (first, second):
        backend.attach_job(1, [0, 1, 2], share=0.7)
    assert [first.sample() for _ in range(3)] == [second.sample() for _ in range(3)]
    other = SimulatedGpus(4, seed=99, hostname="node-a", clock=fixed_clock)
    other.attach_job(1, [0, 1, 2], share=0.7)
    assert other.sample().gpus[0].util_sm_pct != first.sample().gpus[0].util_sm_pct


def test_foreign_process_shows_up_like_a_real_one() -> None:
    backend = sim()
    pid = backend.inject_foreign_process(1, util_pct=40, memory_mb=20_000, pid=31337)
    assert pid == 31337
    reading = gpu(backend, 1)
    assert [(p.pid, p.used_memory_mb) for p in reading.processes] == [(31337, 20_000)]
    assert reading.memory_used_mb == 20_000
    assert reading.util_sm_pct is not None and 35 <= reading.util_sm_pct <= 45
    backend.clear_foreign(1)
    assert gpu(backend, 1).processes == ()


def test_failed_gpu_reads_unhealthy_with_no_values_until_recovered() -> None:
    backend = sim()
    backend.attach_job(5, [2])
    backend.fail_gpu(2)
    reading = gpu(backend, 2)
    assert not reading.healthy
    assert reading.health_message == "GPU has fallen off the bus"
    assert reading.util_sm_pct is None and reading.memory_free_mb is None
    assert reading.power_w is None and reading.temperature_c is None
    assert gpu(backend, 1).healthy
    backend.recover_gpu(2)
    assert gpu(backend, 2).healthy


def test_hooks_reject_bad_indices() -> None:
    backend = sim(2)
    with pytest.raises(IndexError):
        backend.fail_gpu(2)
    with pytest.raises(IndexError):
        backend.attach_job(1, [5])


def test_state_file_is_reread_at_every_sample(tmp_path: Path) -> None:
    state_file = tmp_path / "sim-state.json"
    agent_side = sim(state_file=state_file)
    test_side = sim(state_file=state_file)  # another instance, as another process would have
    test_side.inject_foreign_process(2, util_pct=30, memory_mb=5000, pid=4242)
    assert [p.pid for p in gpu(agent_side, 2).processes] == [4242]

    save_sim_state(state_file, SimInjectedState(failed={1: "Xid 79"}))
    sample = agent_side.sample()
    assert (sample.gpus[1].healthy, sample.gpus[1].health_message) == (False, "Xid 79")
    assert sample.gpus[2].processes == ()  # the file is the whole injected state

    state_file.write_text("{not json")
    assert not agent_side.sample().gpus[1].healthy  # bad file: keep the last good state

    state_file.unlink()
    assert agent_side.sample().gpus[1].healthy
    assert load_sim_state(state_file) == SimInjectedState()


def test_state_file_reaches_a_running_agent_process(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    program = (
        "import sys, time\n"
        "from workers.agent.sim_backend import SimulatedGpus\n"
        f"gpus = SimulatedGpus(2, state_file={str(state_file)!r})\n"
        "deadline = time.monotonic() + 20\n"
        "print('ready', flush=True)\n"
        "while time.monotonic() < deadline:\n"
        "    pids = [p.pid for p in gpus.sample().gpus[1].processes]\n"
        "    if pids:\n"
        "        print(pids, flush=True)\n"
        "        sys.exit(0)\n"
        "    time.sleep(0.02)\n"
        "sys.exit(1)\n"
    )
    agent = subprocess.Popen(
        [sys.executable, "-c", program],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert agent.stdout is not None
        assert agent.stdout.readline().strip() == "ready"
        SimulatedGpus(2, state_file=state_file).inject_foreign_process(1, 50, 1000, pid=777)
        output, _ = agent.communicate(timeout=20)
        assert agent.returncode == 0
        assert output.strip() == "[777]"
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()


# -- specs and open_backend ----------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("sim:8:H100-80GB", SimSpec(1, 8, "H100-80GB", 81559)),
        ("sim:2x8:A100-40GB", SimSpec(2, 8, "A100-40GB", 40960)),
        ("sim:4:A100-80GB", SimSpec(1, 4, "A100-80GB", 81920)),
        ("sim:1:V100-32GB", SimSpec(1, 1, "V100-32GB", 32768)),
        ("sim:2:L4", SimSpec(1, 2, "L4", 23034)),
        ("sim:4:RTX-48GB", SimSpec(1, 4, "RTX-48GB", 48 * 1024)),
        ("sim:4:Mystery", SimSpec(1, 4, "Mystery", 81559)),
        ("sim:6", SimSpec(1, 6, "H100-80GB", 81559)),
        ("sim", SimSpec(1, 4, "H100-80GB", 81559)),
    ],
)
def test_parse_sim_spec(spec: str, expected: SimSpec) -> None:
    assert parse_sim_spec(spec) == expected
    nodes, gpus_per_node, model, memory_mb = parse_sim_spec(spec)  # unpacks as a tuple
    assert (nodes, gpus_per_node, model, memory_mb) == tuple(expected)


@pytest.mark.parametrize(
    "spec", ["sim:x", "sim:0x8:H100-80GB", "sim:0", "simulated", "sim:2x:L4", "sim:L4"]
)
def test_parse_sim_spec_rejects_garbage(spec: str) -> None:
    with pytest.raises(ValueError, match="spec"):
        parse_sim_spec(spec)


def test_open_backend_with_a_sim_spec() -> None:
    backend, line = open_backend("sim:8:L4", hostname="n1")
    assert isinstance(backend, SimulatedGpus)
    assert len(backend.node_info().gpus) == 8
    assert line == "using simulated GPUs sim:8:L4 (23034 MiB each)"

    backend, line = open_backend("sim:2x8:H100-80GB", hostname="n1")
    assert len(backend.node_info().gpus) == 8  # one agent = one node
    assert "one node of sim:2x8:H100-80GB" in line


def test_open_backend_rejects_unknown_specs() -> None:
    with pytest.raises(ValueError, match="unknown GPU backend"):
        open_backend("cuda")


def test_sample_is_fast_enough_for_frequent_polling() -> None:
    backend = sim(8)
    for index in range(8):
        backend.attach_job(index, [index])
    # This process's CPU time, not the wall clock: other processes' turns do not count.
    started = time.process_time()
    for _ in range(200):
        backend.sample()
    assert time.process_time() - started < 1.0
