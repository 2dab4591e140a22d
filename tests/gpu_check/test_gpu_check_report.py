"""The real-GPU check's judgement (bench/gpu_check_report.py) on a recorded session: each
check passes on a sound session and fails on the one reading that breaks it."""

from __future__ import annotations

from typing import Any

import pytest

from bench import gpu_check_report as judge
from tests.gpu_check.session import PIDS, T0, TOPOLOGY_ONE_GPU, changed, iso, session


def results(readings: dict[str, Any]) -> dict[str, str]:
    return {c.name: c.result for c in judge.evaluate(readings)}


def only_failures(readings: dict[str, Any]) -> set[str]:
    return {name for name, result in results(readings).items() if result == judge.FAIL}


def test_a_sound_session_passes_all_but_the_known_torchrun_failure() -> None:
    readings = session()
    found = results(readings)
    assert found.pop("torchrun workers (2 on one GPU) attributed to the job") == judge.KNOWN_FAIL
    assert found.pop("device isolation: a job cannot open a GPU it was not given") == judge.SKIP
    assert set(found.values()) == {judge.PASS}, found
    # Known failing and not available leave the run passing.
    assert judge.exit_code(readings, judge.evaluate(readings)) == judge.EXIT_OK


def test_torchrun_workers_attributed_to_the_job_pass() -> None:
    readings = changed()
    for poll in readings["polls"]:
        for proc in poll["gpus"][0]["processes"]:
            if proc["pid"] in PIDS["workers"]:
                proc["job_id"] = 3
    assert results(readings)["torchrun workers (2 on one GPU) attributed to the job"] == judge.PASS


def test_a_failed_torchrun_job_is_a_failure_not_a_known_one() -> None:
    readings = changed()
    readings["phases"]["torchrun"]["job"]["status"] = "FAILED"
    for poll in readings["polls"]:
        poll["job_pids"].pop("3", None)
    assert "torchrun workers (2 on one GPU) attributed to the job" in only_failures(readings)


@pytest.mark.parametrize(
    ("change", "failing"),
    [
        (lambda r: r["node"]["gpus"][0].update(uuid="GPU-other"), "node registers: UUID"),
        (lambda r: r["node"]["gpus"][0].update(model="H100-80GB"), "node registers: model"),
        (lambda r: r["node"]["gpus"][0].update(memory_total_mb=80000), "node registers: memory (MiB)"),
        (lambda r: r["node"]["gpus"][0].update(nvlink_peers=[1]), "node registers: NVLink peers (topology)"),
        (lambda r: r["node"].update(gpu_backend="sim"), "node registers through NVML"),
    ],
)  # fmt: skip
def test_a_registration_that_differs_from_nvidia_smi_fails(change: Any, failing: str) -> None:
    readings = changed()
    change(readings)
    assert only_failures(readings) == {failing}


def test_memory_in_telemetry_off_by_more_than_the_tolerance_fails() -> None:
    readings = changed()
    for point in readings["phases"]["train"]["telemetry"]:
        point["memory_used_mb"] += judge.MEMORY_TOLERANCE_MB + 200  # e.g. MB read as MiB
    assert only_failures(readings) == {"job page telemetry: memory used"}


def test_memory_within_the_tolerance_passes() -> None:
    readings = changed()
    for point in readings["phases"]["train"]["telemetry"]:
        point["memory_used_mb"] += judge.MEMORY_TOLERANCE_MB - 50
    assert results(readings)["job page telemetry: memory used"] == judge.PASS


def test_utilisation_of_the_live_readings_off_fails() -> None:
    readings = changed()
    for poll in readings["polls"]:
        gpu = poll["gpus"][0]
        gpu["util_pct"] = gpu["util_pct"] / 2  # e.g. an average over a longer period
    assert "live node readings: utilisation" in only_failures(readings)


def test_too_few_rows_to_compare_fail() -> None:
    readings = changed()
    train = readings["phases"]["train"]
    train["telemetry"] = train["telemetry"][: judge.MIN_MATCHED_ROWS - 1]
    failing = only_failures(readings)
    assert {"job page telemetry: memory used", "job page telemetry: utilisation"} <= failing


def test_a_row_is_matched_within_its_window_only() -> None:
    smi = {0: judge.SmiSeries([{"t": 100.0, "index": 0, "util_pct": 50.0}], 0)}
    inside = judge.errors_against_smi([(100.0 + judge.ROW_LAG_S - 0.1, 0, 40.0, "util")], smi)
    outside = judge.errors_against_smi([(100.0 + judge.ROW_LAG_S + 0.5, 0, 40.0, "util")], smi)
    assert inside == [10.0] and outside == []


def test_memory_is_compared_as_total_minus_free() -> None:
    # nvidia-smi's memory.used leaves out the driver's reserved part; NVML's v1 reading,
    # the agent's, does not: the comparison uses total - free for both.
    row = {"memory_total_mb": 81559, "memory_free_mb": 80000, "memory_used_mb": 1000}
    assert judge.smi_memory_used(row) == 1559


@pytest.mark.parametrize(
    ("field", "factor", "failing"),
    [
        ("avg_util_pct", 0.7, "seff: mean utilisation"),
        ("peak_memory_mb", 1.2, "seff: peak memory"),
        ("energy_wh", 1.5, "seff: energy"),
    ],
)
def test_seff_off_from_nvidia_smi_fails(field: str, factor: float, failing: str) -> None:
    readings = changed()
    readings["phases"]["train"]["efficiency"][field] *= factor
    assert only_failures(readings) == {failing}


def test_a_job_that_started_while_the_foreign_process_ran_fails() -> None:
    readings = changed()
    polls = readings["phases"]["foreign"]["job_polls"]
    polls[5].update(status="RUNNING", pending_reason=None)
    assert only_failures(readings) == {"job waits with the foreign-load reason"}


def test_a_wait_for_another_reason_fails() -> None:
    readings = changed()
    for poll in readings["phases"]["foreign"]["job_polls"]:
        if poll["pending_reason"]:
            poll["pending_reason"] = "telemetry_stale"
    assert only_failures(readings) == {"job waits with the foreign-load reason"}


@pytest.mark.parametrize("delay", [2.0, 40.0])
def test_a_start_outside_the_stability_window_fails(delay: float) -> None:
    readings = changed()
    foreign = readings["phases"]["foreign"]
    foreign["job"]["started_at"] = iso(foreign["stopped_at"] + delay)
    assert only_failures(readings) == {
        "job starts after the foreign process ends + stability window"
    }


def test_a_foreign_process_not_shown_fails() -> None:
    readings = changed()
    for poll in readings["polls"]:
        gpu = poll["gpus"][0]
        gpu["processes"] = [p for p in gpu["processes"] if p["pid"] != PIDS["foreign"]]
    assert only_failures(readings) == {"foreign process shown (API and dashboard)"}


def test_the_overview_counts_a_gpu_with_foreign_load_as_foreign_used() -> None:
    node = {"state": "READY"}
    gpu = {"healthy": True, "allocated": 0.0, "foreign_util_pct": 35.0, "foreign_memory_mb": 0}
    assert judge.dashboard_state(node, gpu) == "foreign"
    assert judge.dashboard_state(node, gpu | {"allocated": 1.0}) == "busy"
    assert judge.dashboard_state(node, gpu | {"foreign_util_pct": 0.0}) == "idle"
    assert judge.dashboard_state({"state": "DOWN"}, gpu) == "down"


def test_the_training_process_counted_foreign_fails() -> None:
    readings = changed()
    for poll in readings["polls"]:
        for proc in poll["gpus"][0]["processes"]:
            if proc["pid"] == PIDS["train"]:
                proc["job_id"] = None
    assert "training job's GPU process attributed to it" in only_failures(readings)


def test_a_job_process_only_nvidia_smi_lists_fails() -> None:
    # As when NVML's pids are the host's and the agent's are a container's (issue 39).
    readings = changed()
    for poll in readings["polls"]:
        gpu = poll["gpus"][0]
        gpu["processes"] = [p for p in gpu["processes"] if p["pid"] != PIDS["train"]]
    assert "training job's GPU process attributed to it" in only_failures(readings)


def test_another_process_taken_for_the_job_fails() -> None:
    readings = changed()
    readings["polls"][20]["gpus"][0]["processes"].append({"pid": 31337, "job_id": 1})
    assert only_failures(readings) == {"training job's GPU process attributed to it"}


def test_device_isolation_is_checked_only_where_the_node_fences_devices() -> None:
    readings = changed()
    isolation = "device isolation: a job cannot open a GPU it was not given"
    readings["phases"]["isolation"] = {"reported": {"isolation": "subreaper only"}}
    assert results(readings)[isolation] == judge.SKIP
    readings["phases"]["isolation"] = {
        "reported": {"isolation": "cgroup v1"},
        "result": {"opened": ["nvidia0"], "refused": {}},
    }
    assert results(readings)[isolation] == judge.FAIL
    readings["phases"]["isolation"]["result"] = {
        "opened": [],
        "refused": {"nvidia0": "Operation not permitted"},
    }
    assert results(readings)[isolation] == judge.PASS
    # A machine without GPU device files (a rehearsal on simulated GPUs) checks nothing.
    readings["phases"]["isolation"]["result"] = {"opened": [], "refused": {}}
    assert results(readings)[isolation] == judge.SKIP


def test_the_isolation_a_node_reports_is_read_from_its_fields() -> None:
    assert judge.reported_isolation({"name": "n", "isolation": "cgroup v2"}) == {
        "isolation": "cgroup v2"
    }
    assert judge.reported_isolation({"name": "n", "isolation": ""}) is None
    assert judge.fences_devices({"isolation": "cgroup v1"})
    assert not judge.fences_devices({"isolation": "subreaper only"})
    assert not judge.fences_devices(None)


@pytest.mark.parametrize(
    ("peak", "result"), [(25e9, judge.FAIL), (11e9, judge.FAIL), (17e9, judge.PASS)]
)
def test_the_estimate_is_judged_by_its_ratio_to_the_peak(peak: float, result: str) -> None:
    # 23.5 GB estimated: below a 25 GB peak (a request sized from it would run out of
    # memory), more than twice an 11 GB one, 1.38 times a 17 GB one.
    readings = changed()
    readings["phases"]["train"]["result"]["max_memory_allocated"] = peak
    assert results(readings)["gpusched estimate vs PyTorch's peak memory"] == result


def test_an_estimate_of_another_model_fails() -> None:
    readings = changed()
    readings["phases"]["estimate"]["response"]["parameters"] += 2048  # e.g. RMSNorm counted
    assert only_failures(readings) == {"gpusched estimate vs PyTorch's peak memory"}


def test_leftovers_and_an_overlong_run_fail() -> None:
    readings = changed()
    readings["leftover_pids"] = [777]
    readings["finished_at"] = readings["started_at"] + judge.MAX_DURATION_S + 1
    assert only_failures(readings) == {"cleanup: nothing left running", "ends within 6 minutes"}


def test_phases_not_reached_fail_with_the_reason() -> None:
    readings = changed()
    readings["phases"]["foreign"] = {"error": "timed out after 90 s waiting for the process"}
    checks = {c.name: c for c in judge.evaluate(readings)}
    shown = checks["foreign process shown (API and dashboard)"]
    assert shown.result == judge.FAIL and "timed out after 90 s" in shown.seen


def test_a_stack_that_never_started_fails_every_gpu_check() -> None:
    readings = changed()
    readings.update(node=None, polls=[], phases={}, error="gpusched up exited with code 2")
    checks = judge.evaluate(readings)
    assert "gpusched up exited" in checks[0].seen
    assert judge.exit_code(readings, checks) == judge.EXIT_FAILED
    assert {c.result for c in checks[:-2]} <= {judge.FAIL, judge.SKIP}


def test_no_gpu_and_a_failed_install_have_exit_codes_of_their_own() -> None:
    no_gpu = {"mode": "no-gpu", "reason": "nvidia-smi is not installed"}
    checks = judge.evaluate(no_gpu)
    assert [c.result for c in checks] == [judge.SKIP]
    assert judge.exit_code(no_gpu, checks) == judge.EXIT_NO_GPU
    setup = {"mode": "setup-failed", "reason": "no wheels"}
    assert judge.exit_code(setup, judge.evaluate(setup)) == judge.EXIT_SETUP
    aborted = {"mode": "aborted", "reason": "exit 137"}
    assert judge.exit_code(aborted, judge.evaluate(aborted)) == judge.EXIT_FAILED


def test_topology_nvlink_peers_from_nvidia_smi() -> None:
    assert judge.parse_topology(TOPOLOGY_ONE_GPU) == {0: []}
    nvswitch = (
        "\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\n"
        "GPU0\t X \tNV18\tNV18\tPXB\t0-55\t0\n"
        "GPU1\tNV18\t X \tNV18\tSYS\t0-55\t0\n"
        "GPU2\tNV18\tNV18\t X \tSYS\t56-111\t1\n"
        "NIC0\tPXB\tSYS\tSYS\t X \n"
    )
    assert judge.parse_topology(nvswitch) == {0: [1, 2], 1: [0, 2], 2: [0, 1]}
    pcie = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPHB\t0-7\nGPU1\tPHB\t X \t0-7\n"
    assert judge.parse_topology(pcie) == {0: [], 1: []}


def test_api_times_read_with_or_without_a_zone() -> None:
    assert judge.timestamp("2026-11-25T10:00:00Z") == judge.timestamp("2026-11-25T10:00:00+00:00")
    assert judge.timestamp("2026-11-25T10:00:00") == judge.timestamp("2026-11-25T10:00:00Z")
    assert judge.timestamp(T0) == T0 and judge.timestamp(None) is None


def test_the_report_reads_back_as_written() -> None:
    readings = changed()
    readings["node"]["gpus"][0]["model"] = "a | b"  # a pipe in a cell
    checks = judge.evaluate(readings)
    text = judge.render_report(readings, checks)
    assert "# Real-GPU check: NVIDIA H100 80GB HBM3" in text
    assert f"exit code {judge.EXIT_FAILED}" in text
    assert judge.parse_report(text) == [
        judge.Check(c.name, " ".join(c.expected.split()), " ".join(c.seen.split()), c.result)
        for c in checks
    ]


def test_a_rehearsal_says_so_first() -> None:
    readings = changed()
    readings["mode"] = "rehearsal"
    assert "REHEARSAL" in judge.render_report(readings, judge.evaluate(readings)).split("\n\n")[1]


def test_a_report_without_a_check_table_is_refused() -> None:
    with pytest.raises(ValueError, match="no check table"):
        judge.parse_report("# Real-GPU check\n\nnothing\n")
    bad = f"{judge.TABLE_HEADER}\n| --- | --- | --- | --- |\n| a | b | c | MAYBE |\n"
    with pytest.raises(ValueError, match="not a check row"):
        judge.parse_report(bad)


def test_a_fake_training_result_never_passes() -> None:
    readings = changed()
    readings["phases"]["train"]["result"] = {"fake": True, "shape": {}, "micro_batch": 8}
    failing = only_failures(readings)
    assert {
        "training job runs (submit --gpus 1)",
        "gpusched estimate vs PyTorch's peak memory",
    } <= failing
