"""bench/gpu_check.py's commands that need no GPU: judging a recorded session again, and
summing up a report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench import gpu_check, gpu_check_report
from tests.gpu_check.session import changed, session

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_recorded_session_is_judged_again_from_its_file(tmp_path: Path) -> None:
    (tmp_path / "readings.json").write_text(json.dumps(session()))
    done = run("evaluate", str(tmp_path / "readings.json"), "--out", str(tmp_path / "again"))
    assert done.returncode == gpu_check_report.EXIT_OK, done.stdout + done.stderr
    report = (tmp_path / "again" / "report.md").read_text()
    assert "| torchrun workers (2 on one GPU) attributed to the job |" in report
    summary = run("summarize", str(tmp_path / "again" / "report.md"))
    assert summary.returncode == 0
    assert summary.stdout.splitlines()[0] == "20 PASS, 0 FAIL, 1 KNOWN-FAIL, 1 SKIP"
    assert "KNOWN-FAIL: torchrun workers" in summary.stdout


def test_a_failing_session_exits_1_and_names_the_failure(tmp_path: Path) -> None:
    readings = changed()
    readings["leftover_pids"] = [4321]
    (tmp_path / "readings.json").write_text(json.dumps(readings))
    assert run("evaluate", str(tmp_path / "readings.json"), "--out", str(tmp_path)).returncode == 1
    summary = run("summarize", str(tmp_path / "report.md"))
    assert summary.returncode == 1
    assert "FAIL: cleanup: nothing left running: left running: [4321]" in summary.stdout


def test_the_result_line_of_a_job_log() -> None:
    log = 'step 20 loss 7.1\nGPU_CHECK_RESULT {"steps": 40}\n[gpusched] exit code 0\n'
    assert gpu_check.result_line(log) == {"steps": 40}
    assert gpu_check.result_line("GPU_CHECK_RESULT {broken\n") is None


def test_nvidia_smi_values_and_times() -> None:
    assert gpu_check.smi_value(" 81559 ") == 81559.0
    assert gpu_check.smi_value("[N/A]") is None
    stamp = gpu_check.smi_time("2026/11/25 10:00:00.250")
    assert stamp is not None and stamp % 1 == 0.25
    assert gpu_check.smi_time("yesterday") is None
