"""The watchdog stops its agent's jobs once the agent is gone (its stdin pipe closes), with
each job's grace period; other installations' and other nodes' jobs are not touched."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.support import installation_of
from tests.agent.test_agent_fence import KINDS, alive, clean, first_line, make_fence
from tests.support.wait import WAIT_S, wait_until
from workers.agent.runner import JobLaunch, start_job


@pytest.mark.parametrize("kind", KINDS)
def test_jobs_of_the_agent_die_with_it_and_others_survive(tmp_path: Path, kind: str) -> None:
    mine = make_fence(kind, installation_of(tmp_path))
    # The same node name in another installation (another stack on this host), and
    # another node of this one.
    others = [
        make_fence(kind, installation_of(tmp_path / "x")),
        make_fence(kind, mine.installation, "n2"),
    ]
    command = (
        "trap 'sleep 0.5; echo saved > saved-$GPUSCHED_NODE-$$; exit 0' TERM; "
        'setsid env -i sh -c "exec sleep 313" & echo $! > escaped-$GPUSCHED_NODE-$$; '
        "sleep 60 & wait"
    )  # fmt: skip
    jobs = []
    for i, fence in enumerate([mine, *others]):
        spec = JobLaunch(
            command=command, workdir=tmp_path, job_id=5, attempt=1, node=fence.node,
            log_path=tmp_path / f"{i}.log", grace_s=3,
        )  # fmt: skip
        jobs.append(start_job(spec, fence=fence))
    try:
        escaped = int(first_line(tmp_path / f"escaped-n1-{jobs[0].pid}"))
        watchdog = subprocess.Popen(
            [sys.executable, "-m", "workers.agent.watchdog", mine.installation, "n1",
             mine.isolation, "0.1"],
            stdin=subprocess.PIPE,
        )  # fmt: skip
        assert watchdog.stdin is not None
        watchdog.stdin.write(b"start 5 1 3\n")  # its grace: 3 s, not the default 0.1
        watchdog.stdin.flush()
        assert watchdog.poll() is None  # waits while the pipe is open
        watchdog.stdin.close()  # what the kernel does when the agent dies
        assert watchdog.wait(timeout=WAIT_S) == 0
        assert mine.find() == []
        assert wait_until(lambda: not alive(escaped))
        assert jobs[0].wait(WAIT_S) is not None
        assert (tmp_path / f"saved-n1-{jobs[0].pid}").exists()  # it had its grace period
        # The watchdog is done: nobody else's job was touched.
        assert all(job.poll() is None for job in jobs[1:])
        assert all(len(f.find()) == 1 for f in others)
    finally:
        for job in jobs:
            job.terminate("cancel", grace_s=0, timeout_s=10)
        for fence in [mine, *others]:
            clean(fence)
