"""`bash bench/gpu_check.sh` here, with no GPU: it stops early and says why, with an exit
code of its own; and its rehearsal (simulated GPUs, CPU stand-ins for the GPU programs)
drives the real stack through every phase and leaves nothing running, also when it is
stopped halfway."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from bench import gpu_check_report as judge
from tests.support.wait import poll

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
FAKE_SMI = str(Path(__file__).with_name("fake_nvidia_smi.py"))


def broken_nvidia_smi(folder: Path, *, prints: str, exit_code: int) -> dict[str, str]:
    folder.mkdir()
    tool = folder / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\necho '{prints}'\nexit {exit_code}\n")
    tool.chmod(0o755)
    return {"PATH": f"{folder}:{os.environ['PATH']}"}


def fake_nvidia_smi(folder: Path) -> dict[str, str]:
    """nvidia-smi as one idle H100 answers the check (fake_nvidia_smi.py)."""
    folder.mkdir()
    tool = folder / "nvidia-smi"
    tool.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE_SMI} "$@"\n')
    tool.chmod(0o755)
    return {"PATH": f"{folder}:{os.environ['PATH']}"}


def check(out: Path, env: dict[str, str] | None = None, timeout: float = 60) -> int:
    done = subprocess.run(
        ["bash", str(SCRIPT), str(out)],
        env={**os.environ, "GPU_CHECK_PYTHON": sys.executable, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done.returncode


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_without_nvidia_smi_it_stops_at_once_saying_so(tmp_path: Path) -> None:
    assert check(tmp_path / "out") == judge.EXIT_NO_GPU
    checks = judge.parse_report((tmp_path / "out" / "report.md").read_text())
    assert [(c.name, c.result) for c in checks] == [("NVIDIA GPU present", judge.SKIP)]
    assert "nvidia-smi is not installed" in checks[0].seen
    assert "no NVIDIA GPU here" in (tmp_path / "out" / "run.log").read_text()


def test_a_driver_that_sees_no_gpu_stops_too(tmp_path: Path) -> None:
    env = broken_nvidia_smi(tmp_path / "bin", prints="No devices were found", exit_code=6)
    assert check(tmp_path / "out", env) == judge.EXIT_NO_GPU
    report = (tmp_path / "out" / "report.md").read_text()
    assert "No devices were found" in report


def test_without_the_wheels_the_install_fails_with_its_own_code(tmp_path: Path) -> None:
    env = fake_nvidia_smi(tmp_path / "bin")
    env["GPU_CHECK_WHEELS"] = str(tmp_path / "no-wheels")
    assert check(tmp_path / "out", env) == judge.EXIT_SETUP
    checks = judge.parse_report((tmp_path / "out" / "report.md").read_text())
    assert [(c.name, c.result) for c in checks] == [("install from the carried wheels", judge.FAIL)]
    assert "make gpu-wheels" in (tmp_path / "out" / "run.log").read_text()


def rehearsal_env(marker: str) -> dict[str, str]:
    """This interpreter's venv has gpusched: the rehearsal installs nothing. A library path
    (as a GPU machine may need for the CUDA driver) goes to the jobs; it is this run's own,
    so that its processes are told from those of a rehearsal running beside it."""
    return {
        "GPU_CHECK_REHEARSE": "1",
        "GPU_CHECK_VENV": sys.prefix,
        "GPU_CHECK_PYTHON": sys.executable,
        "LD_LIBRARY_PATH": f"/nonexistent/gpu-check-{marker}/lib",
    }


def processes_of(marker: str) -> dict[int, bytes]:
    """pid -> command line of each live process of the run that `marker` names: the stack,
    its jobs, the foreign process and nvidia-smi's loop all carry it in their environment."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                found[int(entry.name)] = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # ended meanwhile
    return found


def readings(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / "readings.json").read_text()))


@pytest.mark.e2e
def test_a_rehearsal_runs_every_phase_against_the_real_stack_and_cleans_up(tmp_path: Path) -> None:
    out, marker = tmp_path / "out", uuid.uuid4().hex
    env = rehearsal_env(marker) | fake_nvidia_smi(tmp_path / "bin")
    code = check(out, env, timeout=400)
    found = readings(out)
    results = {c.name: c.result for c in judge.parse_report((out / "report.md").read_text())}
    # nvidia-smi's figures are made up here, so a rehearsal never passes.
    assert code == judge.EXIT_FAILED and found["mode"] == "rehearsal"
    assert found["error"] is None, found["error"]
    phases = found["phases"]
    assert {name: phases[name].get("error") for name in phases} == dict.fromkeys(phases)
    assert phases["train"]["job"]["status"] == "SUCCEEDED" and phases["train"]["telemetry"]
    assert phases["train"]["job"]["env"] == {"LD_LIBRARY_PATH": env["LD_LIBRARY_PATH"]}
    assert phases["train"]["efficiency"]["samples"] > 0
    assert phases["estimate"]["response"]["per_gpu_bytes"]["total"] > 0
    # The scheduler itself is real: the foreign process (injected into the simulated GPU
    # with the pid of a real process) holds the job back until the window has passed.
    for name in (
        "foreign process shown (API and dashboard)",
        "job waits with the foreign-load reason",
        "job starts after the foreign process ends + stability window",
        "training job's GPU process attributed to it",
        "cleanup: nothing left running",
        "ends within 6 minutes",
    ):
        assert results[name] == judge.PASS, name
    assert results["device isolation: a job cannot open a GPU it was not given"] == judge.SKIP
    # The driver finds torchrun's workers, in sessions of their own, by the job's id.
    torchrun = str(phases["torchrun"]["job_id"])
    assert phases["torchrun"]["job"]["status"] == "SUCCEEDED"
    assert max(len(p.get("job_pids", {}).get(torchrun, [])) for p in found["polls"]) == 3
    # nvidia-smi's readers: its GPU, its topology, its readings every half second.
    assert [g["name"] for g in found["smi"]["gpus"]] == ["NVIDIA H100 80GB HBM3"]
    assert judge.parse_topology(found["smi"]["topology"]) == {0: []}
    samples = found["smi_samples"]
    assert len(samples) > 20 and samples[0]["memory_free_mb"] == 80939
    assert found["started_at"] <= samples[0]["t"] < samples[-1]["t"] <= found["finished_at"]
    # Nothing of the run is left: not by its own account, and not by /proc's.
    assert found["stop_leftovers"] == [] and found["leftover_pids"] == []
    assert processes_of(marker) == {}


def training_job_of(marker: str) -> bool:
    """The run's training program runs as a job (not only named by `gpusched submit`)."""
    for pid, cmdline in processes_of(marker).items():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if b"\0train\0" in cmdline and b"GPUSCHED_JOB_ID=" in environ:
            return True
    return False


@pytest.mark.e2e
def test_stopped_halfway_it_still_stops_the_stack_and_writes_its_report(tmp_path: Path) -> None:
    out, marker = tmp_path / "out", uuid.uuid4().hex
    env = {**os.environ, **rehearsal_env(marker), "GPU_CHECK_TRAIN_S": "120"}
    script = subprocess.Popen(["bash", str(SCRIPT), str(out)], env=env, start_new_session=True)
    try:
        poll(
            "the rehearsal's training job to run",
            lambda: script.poll() is None and training_job_of(marker),
            timeout=240,
            interval=0.5,
            on_timeout=lambda: (out / "run.log").read_text(),
        )
        driver = re.search(r"driver pid (\d+)", (out / "run.log").read_text())
        assert driver is not None
        os.kill(int(driver[1]), signal.SIGTERM)
        code = script.wait(120)
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
    found = readings(out)
    assert code == judge.EXIT_FAILED
    assert found["error"] == "stopped by SIGTERM"
    assert found["leftover_pids"] == []
    assert processes_of(marker) == {}
    checks = {c.name: c for c in judge.parse_report((out / "report.md").read_text())}
    assert checks["cleanup: nothing left running"].result == judge.PASS
    assert "stopped by SIGTERM" in checks["gpusched estimate vs PyTorch's peak memory"].seen
