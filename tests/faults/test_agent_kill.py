"""kill -9 an agent mid-job: its watchdog ends its jobs within their grace period; they
become LOST, are requeued (no retry spent) onto the other agent once surely ended, and
finish; a restarted agent finds nothing of them left."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.faults.support import Traffic, kill9, marker_command, verify, wait_all_done
from tests.support.wait import poll

pytestmark = pytest.mark.e2e


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def test_agent_sigkill_mid_job(make_stack, record, tmp_path: Path) -> None:
    stack = make_stack()
    runs = tmp_path / "runs"
    victim = stack.submit(
        {
            "command": (
                'echo "$$" > ' + str(tmp_path / "pid-$GPUSCHED_ATTEMPT") + "; "
                + marker_command(runs, 0.5).replace("sleep 0.5", 'sleep "$([ $GPUSCHED_ATTEMPT = 1 ] && echo 120 || echo 0.5)"')
            ),
            "gpus": 2,
            "retries": 1,
        }
    )  # fmt: skip
    running = stack.wait_status(victim["id"], "RUNNING")
    node = running["allocations"][0]["node"]
    dead = next(short for short, name in stack.node_names.items() if name == node)
    pid_file = tmp_path / "pid-1"
    leftover = int(
        poll(
            "attempt 1 pid", lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=10
        )
    )

    traffic = Traffic(
        stack,
        {"command": marker_command(runs, 0.3), "gpus": 1, "retries": 1},
        interval=0.3,
        limit=20,
    ).start()
    poll("some traffic", lambda: len(traffic.ids) >= 4)
    killed_at = time.monotonic()
    kill9(stack, f"agent-{node}")

    stack.wait_status(victim["id"], "SUCCEEDED", timeout=45)
    recover = time.monotonic() - killed_at
    traffic.stop()
    wait_all_done(stack, timeout=60)

    done = stack.job(victim["id"])
    assert done["attempt"] == 2
    events = stack.events(victim["id"])
    steps = [(e["attempt"], e["to_status"]) for e in events]
    second = next(e for e in events if e["attempt"] == 2 and e["to_status"] == "SCHEDULED")
    assert not second["reason"].startswith(f"placed on {node}:"), second
    assert (1, "LOST") in steps and steps[-1] == (2, "SUCCEEDED")
    # SIGKILL gave the agent no chance to stop its job; its watchdog did, before the
    # scheduler requeued it (the attempt stays LOST until its grace period is over).
    outlived = _alive(leftover)
    assert not outlived
    restarted_wall = time.time()
    stack.start_agent(dead)
    stack.wait_nodes_ready([dead], timeout=30)
    poll("the restarted agent to kill the leftover", lambda: not _alive(leftover))
    assert not [g for g in stack.job_processes(dead) if g.key.job_id == victim["id"]]

    ids = [victim["id"], *traffic.ids]
    verdict = verify(stack, ids, runs=runs)
    record("agent kill -9 mid-job (+restart)", verdict.submitted, len(verdict.lost),
           len(verdict.duplicated) + len(verdict.gpu_overlaps), recover,
           f"{sum(1 for j in ids if stack.job(j)['attempt'] > 1)} requeued, "
           f"{len(verdict.reruns)} ran twice (attempt 1 finished orphaned); "
           f"leftover alive until restart: {outlived}")  # fmt: skip
    assert not traffic.server_errors()
    # A job that finished just before the kill, while its agent had yet to send the report,
    # is declared LOST and runs again: attempt 1 ran on the killed node and the scheduler
    # never saw it finish. So does one the agent started just before the kill, before its
    # start was reported: the scheduler requeues it as not started (a loaded machine).
    # Anything else that ran twice is a real duplicate.
    starts = {
        (int(j), int(a)): float(t)
        for j, a, kind, t, _n in (line.split() for line in runs.read_text().splitlines())
        if kind == "s"
    }
    stale = {}
    for job_id, ends in verdict.reruns.items():
        orphan = [e for e in ends if e[0] == 1 and e[3] == node]
        assert len(orphan) == 1 and len(ends) == 2, (job_id, ends)
        attempt_1 = [
            (e["to_status"], e["reason"]) for e in stack.events(job_id) if e["attempt"] == 1
        ]
        statuses = [status for status, _reason in attempt_1]
        unreported = statuses == ["SCHEDULED", "PENDING"] and (
            "before its start was reported" in attempt_1[-1][1]
        )
        assert ("LOST" in statuses or unreported) and "SUCCEEDED" not in statuses, (
            job_id,
            attempt_1,
        )
        if starts[(job_id, 1)] > restarted_wall:
            stale[job_id] = ends  # attempt 1 started by the killed agent's successor
    verdict.assert_clean(allow_reruns=True)
    # A run_job queued for the killed agent is refused by its successor (sent before it
    # started). (An attempt whose start marker is a moment after the kill was forked before
    # it, on a loaded machine: an orphan like the others, not a stale order.)
    assert not stale, stale


def test_a_run_queued_for_a_dead_agent_is_not_started_by_its_successor(
    make_stack, tmp_path: Path
) -> None:
    """A job placed on a node whose agent just died is requeued when the node is declared
    lost, without spending a retry (it never started); its first run_job is still queued
    (and not expired) when the agent comes back. The new agent must not start that
    attempt: only the requeued one runs."""
    stack = make_stack(
        agents={"n1": "sim:2:H100-80GB"},
        env={"GPUSCHED_SCHEDULER_DISPATCH_TIMEOUT_S": "30"},  # outlives the node's loss
    )
    runs = tmp_path / "runs"
    kill9(stack, f"agent-{stack.name('n1')}")
    job = stack.submit({"command": marker_command(runs, 0.2), "gpus": 1})  # no retries
    poll(
        "attempt 1 to be requeued with the node",
        lambda: any(
            "before its start was reported" in e["reason"] for e in stack.events(job["id"])
        ),
    )
    stack.start_agent("n1")

    done = stack.wait_status(job["id"], "SUCCEEDED", timeout=30)
    assert done["attempt"] == 2
    ran = [line.split()[:3] for line in runs.read_text().splitlines()]
    assert ran == [[str(job["id"]), "2", "s"], [str(job["id"]), "2", "e"]], ran
    log = stack.agent("n1").log.read_text()
    assert "run_job sent before this agent started; ignored" in log


def test_agent_sigkill_requeues_a_job_with_no_retries_and_never_runs_two_attempts(
    make_stack, record, tmp_path: Path
) -> None:
    """The default `retries: 0`: a node's failure is not the job's (issue 32). Attempt 1
    checkpoints on SIGTERM and leaves a `setsid` escape behind; the dead agent's watchdog
    ends both within the job's grace period, and attempt 2 starts only after that (the
    scheduler keeps the attempt LOST until then): it checks, as its first act, that
    nothing of attempt 1 is left."""
    stack = make_stack()
    runs = tmp_path / "runs"
    command = (
        f'R={runs}; A=$GPUSCHED_ATTEMPT; echo "$A s $(date +%s.%N)" >> $R; '
        'if [ "$A" = 1 ]; then '
        "  trap 'sleep 1; echo \"1 e $(date +%s.%N)\" >> $R; exit 0' TERM; "
        f'  setsid env -i sh -c "exec sleep 313" & echo $! > {tmp_path}/escaped; '
        f"  echo $$ > {tmp_path}/main; sleep 120 & wait; "
        "else "
        f"  for p in $(cat {tmp_path}/escaped {tmp_path}/main); do "
        '    [ -d /proc/$p ] && grep -q "^State:.*[RSD]" /proc/$p/status && echo "$A alive $p" >> $R; '
        "  done; "
        '  sleep 0.5; echo "$A e $(date +%s.%N)" >> $R; '
        "fi"
    )
    job = stack.submit({"command": command, "gpus": 4})  # retries: 0, the default
    running = stack.wait_status(job["id"], "RUNNING", timeout=30)
    node = running["allocations"][0]["node"]
    # Written last, after its trap and its escape: attempt 1 is all set up.
    poll(
        "attempt 1's escape",
        lambda: (tmp_path / "main").read_text().strip() if (tmp_path / "main").exists() else None,
    )
    escaped = int((tmp_path / "escaped").read_text())
    killed_at = time.monotonic()
    kill9(stack, f"agent-{node}")

    done = stack.wait_status(job["id"], "SUCCEEDED", "FAILED", "CANCELLED", timeout=90)
    recover = time.monotonic() - killed_at
    assert done["status"] == "SUCCEEDED" and done["attempt"] == 2, done
    steps = [(e["attempt"], e["to_status"]) for e in stack.events(job["id"])]
    assert steps == [
        (0, "PENDING"), (1, "SCHEDULED"), (1, "RUNNING"), (1, "LOST"), (1, "PENDING"),
        (2, "SCHEDULED"), (2, "RUNNING"), (2, "SUCCEEDED"),
    ], steps  # fmt: skip
    lines = [line.split() for line in runs.read_text().splitlines()]
    overlaps = [line for line in lines if line[1] == "alive"]
    times = {(int(a), what): float(t) for a, what, t in lines if what in "se"}
    assert not overlaps, lines
    # Attempt 1 had its grace period (it checkpointed), and ended before attempt 2 began.
    assert times[(1, "e")] < times[(2, "s")], lines
    assert not _alive(escaped)
    record("agent kill -9, retries 0 (+setsid escape)", 1, 0, len(overlaps), recover,
           "requeued, no retry spent; attempt 1 ended "
           f"{times[(2, 's')] - times[(1, 'e')]:.1f}s before attempt 2")  # fmt: skip
