"""A job's life through the real stack: API -> scheduler -> Redis/Celery -> agent ->
subprocess -> reports -> API. One 4-GPU simulated node, shared by the tests of this module
(each test leaves nothing running)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from app.wire import Finished, Started
from tests.support.stack import Stack
from tests.support.wait import poll

pytestmark = pytest.mark.e2e

STACK_AGENTS = {"n1": "sim:4:H100-80GB"}

# Fast jobs sleep a moment before they exit: a job whose "finished" report is handled at the
# same time as its "started" report hits a lost-update race on SQLite, reproduced on its own
# in test_report_race.py. These tests are about other things.
FAST = "sleep 0.2"


def _transitions(events: list[dict]) -> list[tuple[int, str]]:
    return [(e["attempt"], e["to_status"]) for e in events]


def _proc_alive(pid: int) -> bool:
    """Alive and not a zombie (an orphan in a container whose init does not reap stays Z)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def test_job_sees_exactly_its_gpus_and_succeeds(stack: Stack) -> None:
    job = stack.submit({"command": "echo visible=$CUDA_VISIBLE_DEVICES; sleep 1", "gpus": 2})
    assert job["status"] == "PENDING"
    running = stack.wait_status(job["id"], "RUNNING")
    allocs = running["allocations"]
    assert {a["node"] for a in allocs} == {stack.name("n1")}
    indices = sorted(a["gpu_index"] for a in allocs)
    assert len(indices) == 2 and len(set(indices)) == 2
    done = stack.wait_status(job["id"], "SUCCEEDED", "FAILED")
    assert done["status"] == "SUCCEEDED" and done["exit_code"] == 0
    assert done["allocations"] == []  # released when it finished
    log = stack.logs(job["id"])
    assert f"visible={','.join(map(str, indices))}" in log.splitlines()
    assert _transitions(stack.events(job["id"])) == [
        (0, "PENDING"),
        (1, "SCHEDULED"),
        (1, "RUNNING"),
        (1, "SUCCEEDED"),
    ]


def test_two_whole_node_jobs_never_share_gpus(stack: Stack, work: Path) -> None:
    spans = work / "spans"
    # Each job runs until the test lets it end (not a fixed sleep, which a busy machine
    # can outlast before the second job is seen waiting).
    release = work / "release"
    command = (
        f'echo "start $GPUSCHED_JOB_ID $(date +%s.%N) $CUDA_VISIBLE_DEVICES" >> {spans}; '
        f"while [ ! -e {release} ]; do sleep 0.05; done; "
        f'echo "end $GPUSCHED_JOB_ID $(date +%s.%N)" >> {spans}'
    )
    first = stack.submit({"command": command, "gpus": 4})
    stack.wait_status(first["id"], "RUNNING")
    second = stack.submit({"command": command, "gpus": 4})
    waiting = stack.wait_job(
        second["id"],
        lambda j: j["status"] == "PENDING" and j["pending_reason"] == "waiting_for_gpus",
        "PENDING with reason waiting_for_gpus",
    )
    assert waiting["allocations"] == []
    assert stack.job(first["id"])["status"] == "RUNNING"
    release.touch()
    a = stack.wait_status(first["id"], "SUCCEEDED")
    b = stack.wait_status(second["id"], "SUCCEEDED")
    assert b["started_at"] >= a["finished_at"]
    # The jobs' own clocks: the second started after the first's last process ended.
    lines = [line.split() for line in spans.read_text().splitlines()]
    times = {(kind, int(job_id)): float(at) for kind, job_id, at, *_ in lines}
    assert times[("start", second["id"])] > times[("end", first["id"])]
    visible = [line[3] for line in lines if line[0] == "start"]
    assert visible == ["0,1,2,3", "0,1,2,3"]


def test_max_runtime_kills_with_sigterm_and_times_out(stack: Stack) -> None:
    job = stack.submit({"command": "sleep 30", "gpus": 1, "max_runtime_s": 1})
    done = stack.wait_status(job["id"], "TIMED_OUT", "FAILED", "SUCCEEDED", timeout=60)
    assert done["status"] == "TIMED_OUT"
    ran = datetime.fromisoformat(done["finished_at"]) - datetime.fromisoformat(done["started_at"])
    assert ran < timedelta(seconds=15)  # not the 30 s of the sleep
    assert "sending SIGTERM to the job (timeout)" in stack.logs(job["id"])
    events = stack.events(job["id"])
    assert events[-1]["to_status"] == "TIMED_OUT" and "timeout" in events[-1]["reason"]


def test_an_admin_extends_a_running_jobs_time_limit_then_shortens_it(stack: Stack) -> None:
    # scontrol update TimeLimit= on a running job: the agent enforces the new limit.
    # A first limit that the start's report, the PATCH and the agent's order all come
    # well within, even on a loaded machine.
    job = stack.submit({"command": "sleep 90", "gpus": 1, "max_runtime_s": 10})
    stack.wait_status(job["id"], "RUNNING")
    stack.api("PATCH", f"/api/v1/jobs/{job['id']}", json={"max_runtime_s": 60})
    poll(
        "the agent took the new limit",
        lambda: "time limit changed: 60s from the start" in stack.logs(job["id"]),
    )
    started = datetime.fromisoformat(stack.job(job["id"])["started_at"])
    poll(
        "the job to run past its first limit (10 s)",
        lambda: datetime.now(UTC) - started > timedelta(seconds=11),
    )
    assert stack.job(job["id"])["status"] == "RUNNING"
    stack.api("PATCH", f"/api/v1/jobs/{job['id']}", json={"max_runtime_s": 12})
    done = stack.wait_status(job["id"], "TIMED_OUT", "FAILED", "SUCCEEDED", timeout=30)
    assert done["status"] == "TIMED_OUT" and done["max_runtime_s"] == 12
    assert "sending SIGTERM to the job (timeout)" in stack.logs(job["id"])


def test_a_job_gets_its_own_grace_period_to_checkpoint_at_its_time_limit(
    stack: Stack, work: Path
) -> None:
    # The checkpoint takes 3 s; the agent's grace is 2 s, the job asks for 10 (room for a
    # loaded machine). The limit leaves the shell time to set its trap first.
    saved = work / "checkpoint"
    job = stack.submit(
        {
            "command": f"trap 'sleep 3; echo $GPUSCHED_GRACE_S > {saved}; exit 0' TERM; "
            "sleep 60 & wait",
            "gpus": 1,
            "max_runtime_s": 3,
            "grace_s": 10,
        }
    )
    assert job["grace_s"] == 10
    done = stack.wait_status(job["id"], "TIMED_OUT", "FAILED", "SUCCEEDED", timeout=30)
    assert done["status"] == "TIMED_OUT"
    assert saved.read_text() == "10\n"  # it finished writing, and knew its grace
    assert "sending SIGTERM to the job (timeout); SIGKILL in 10s" in stack.logs(job["id"])


def test_a_job_stuck_in_its_grace_period_is_killed_by_a_cancel_with_grace_0(
    stack: Stack,
) -> None:
    job = stack.submit({"command": "trap '' TERM; sleep 120 & wait", "gpus": 1, "grace_s": 120})
    stack.wait_status(job["id"], "RUNNING")
    assert stack.cancel(job["id"])["cancel_requested"]
    poll("SIGTERM sent", lambda: "SIGTERM" in stack.logs(job["id"]))
    assert stack.job(job["id"])["status"] == "RUNNING"  # it ignores SIGTERM: 120 s left

    refused = stack.api("POST", f"/api/v1/jobs/{job['id']}/cancel?grace_s=-1", check=False)
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["loc"] == ["query", "grace_s"]
    stack.api("POST", f"/api/v1/jobs/{job['id']}/cancel?grace_s=0")
    done = stack.wait_status(job["id"], "CANCELLED", "FAILED", "SUCCEEDED")
    assert done["status"] == "CANCELLED"
    assert "grace period shortened: SIGKILL in 0s" in stack.logs(job["id"])
    reasons = [e["reason"] for e in stack.events(job["id"])]
    assert "cancel again (SIGKILL now)" in reasons


def test_a_requeued_job_checkpoints_in_its_grace_and_resumes_on_its_next_attempt(
    stack: Stack, work: Path
) -> None:
    checkpoint = work / "checkpoint"
    job = stack.submit(
        {
            "command": f"if [ -f {checkpoint} ]; then echo resumed from $(cat {checkpoint}); "
            "exit 0; fi; "
            f"trap 'sleep 1; echo step-42 > {checkpoint}; exit 0' TERM; "
            "echo training; sleep 60 & wait",
            "gpus": 1,
            "grace_s": 10,
        }
    )
    stack.wait_status(job["id"], "RUNNING")
    poll("training", lambda: "training" in stack.logs(job["id"]))
    assert stack.api("POST", f"/api/v1/jobs/{job['id']}/requeue").json()["requeue_requested"]
    done = stack.wait_job(
        job["id"],
        lambda j: j["status"] == "SUCCEEDED" and j["attempt"] == 2,
        "SUCCEEDED on attempt 2",
        timeout=30,
    )
    assert done["failures"] == 0  # a requeue spends no retry
    assert "resumed from step-42" in stack.logs(job["id"], attempt=2)
    transitions = _transitions(stack.events(job["id"]))
    assert (1, "PREEMPTED") in transitions and (2, "SUCCEEDED") in transitions


def test_cancel_kills_every_process_of_the_job(stack: Stack, work: Path) -> None:
    pids = work / "pids"
    job = stack.submit(
        {
            # A shell with a background child and a foreground child: all in its fence.
            "command": f"sleep 300 & echo $$ $! >> {pids}; sleep 300",
            "gpus": 1,
        }
    )
    stack.wait_status(job["id"], "RUNNING")
    shell_pid, child_pid = map(
        int,
        poll("pid file", lambda: pids.exists() and pids.read_text().split()),
    )
    assert _proc_alive(shell_pid) and _proc_alive(child_pid)
    [group] = [g for g in stack.job_processes() if g.key.job_id == job["id"]]
    assert {shell_pid, child_pid} <= group.pids()
    cancelled = stack.cancel(job["id"])
    assert cancelled["cancel_requested"] or cancelled["status"] == "CANCELLED"
    done = stack.wait_status(job["id"], "CANCELLED", "FAILED", "SUCCEEDED")
    assert done["status"] == "CANCELLED"
    poll(
        "job processes gone",
        lambda: not (_proc_alive(shell_pid) or _proc_alive(child_pid)),
    )
    assert not [g for g in stack.job_processes() if g.key.job_id == job["id"]]
    assert "sending SIGTERM to the job (cancel)" in stack.logs(job["id"])


def test_exit_code_propagates(stack: Stack) -> None:
    job = stack.submit({"command": f"echo about to fail; {FAST}; exit 3", "gpus": 1})
    done = stack.wait_status(job["id"], "FAILED", "SUCCEEDED")
    assert done["status"] == "FAILED" and done["exit_code"] == 3
    assert done["attempt"] == 1
    assert "about to fail" in stack.logs(job["id"])


def test_failed_job_is_retried_then_fails(stack: Stack, work: Path) -> None:
    runs = work / "runs"
    job = stack.submit(
        {"command": f"echo $GPUSCHED_ATTEMPT >> {runs}; {FAST}; exit 3", "gpus": 1, "retries": 1}
    )
    done = stack.wait_job(
        job["id"],
        lambda j: j["status"] == "FAILED" and j["attempt"] == 2,
        "FAILED on attempt 2",
        timeout=30,
    )
    assert done["exit_code"] == 3 and done["failures"] == 1
    assert runs.read_text().split() == ["1", "2"]
    assert _transitions(stack.events(job["id"])) == [
        (0, "PENDING"),
        (1, "SCHEDULED"),
        (1, "RUNNING"),
        (1, "FAILED"),
        (1, "PENDING"),
        (2, "SCHEDULED"),
        (2, "RUNNING"),
        (2, "FAILED"),
    ]


def test_stale_attempt_report_is_ignored(stack: Stack) -> None:
    """Attempt 1 fails and is retried; while attempt 2 runs, a late 'finished' (and
    'started') report for attempt 1 arrives through Celery: nothing may change."""
    job = stack.submit(
        {
            "command": f'{FAST}; if [ "$GPUSCHED_ATTEMPT" = 1 ]; then exit 1; fi; sleep 60',
            "gpus": 1,
            "retries": 1,
        }
    )
    running = stack.wait_job(
        job["id"],
        lambda j: j["status"] == "RUNNING" and j["attempt"] == 2,
        "RUNNING on attempt 2",
        timeout=30,
    )
    before = stack.events(job["id"])
    node = stack.name("n1")
    scheduler_log = stack.procs["scheduler"].log
    for stale in (
        Finished(node=node, job_id=job["id"], attempt=1, result="SUCCEEDED", message="stale"),
        Started(node=node, job_id=job["id"], attempt=1, pid=1),
    ):
        stack.send_report(stale)
        kind = stale.KIND
        pattern = re.compile(
            rf"ignored {kind} report: stale report for attempt 1; job {job['id']} is on attempt 2"
        )
        # The scheduler logs every report it ignores: wait for that line, not a fixed time.
        poll(
            f"scheduler to ignore the stale {kind} report",
            lambda p=pattern: p.search(scheduler_log.read_text(errors="replace")),
        )
    after = stack.job(job["id"])
    assert after["status"] == "RUNNING" and after["attempt"] == 2
    assert after["allocations"] == running["allocations"]
    assert after["exit_code"] is None
    assert stack.events(job["id"]) == before
    stack.cancel(job["id"])
    stack.wait_status(job["id"], "CANCELLED")
