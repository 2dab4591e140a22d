"""The watchdog stops a node's jobs once its agent is gone (its stdin pipe closes)."""

import subprocess
import sys
import uuid
from pathlib import Path

from tests.support.wait import WAIT_S, wait_until
from workers.agent.runner import JobLaunch, find_leftover_processes, start_job


def test_jobs_of_the_node_die_with_their_agent_and_others_survive(tmp_path: Path):
    node, other = f"wd-{uuid.uuid4().hex[:6]}", f"wd-{uuid.uuid4().hex[:6]}"
    jobs = {
        name: start_job(
            JobLaunch(
                command="sleep 60 & sleep 60",
                workdir=tmp_path,
                job_id=i,
                attempt=1,
                log_path=tmp_path / f"{name}.log",
                node=name,
                grace_s=1,
            )
        )
        for i, name in enumerate((node, other), start=1)
    }
    watchdog = subprocess.Popen(
        [sys.executable, "-m", "workers.agent.watchdog", node, "1"], stdin=subprocess.PIPE
    )
    try:
        assert watchdog.poll() is None  # waits while the pipe is open
        assert watchdog.stdin is not None
        watchdog.stdin.close()  # what the kernel does when the agent dies
        assert watchdog.wait(timeout=WAIT_S) == 0
        assert wait_until(lambda: find_leftover_processes(node=node) == [])
        assert jobs[node].wait(WAIT_S) is not None
        assert jobs[other].poll() is None  # another agent's job is not touched
    finally:
        jobs[other].terminate("cancel", grace_s=0.5)
