"""Takes a node's jobs down when their agent dies.

    python -m workers.agent.watchdog INSTALLATION NODE ISOLATION GRACE_S
    (stdin: a pipe held by the agent)

A job that outlives its agent (kill -9, OOM killer) keeps its GPUs busy while the
scheduler, seeing the node silent, requeues it elsewhere: the same job would run twice.
The agent starts this process with a pipe as its stdin, and tells it on that pipe each
attempt it starts (``start JOB ATTEMPT GRACE_S``) and ends (``end JOB ATTEMPT``); the
kernel closes the pipe when the agent exits in any way. Then every group of the agent's
fence (its installation's, its node's: workers/agent/fence.py) gets SIGTERM, its job's
grace period, then SIGKILL. The scheduler requeues a lost attempt only once that grace is
over (app/jobs/agent_reports.py), so the two never run at once. On a clean shutdown the agent
has stopped its jobs already, so there is nothing left to kill.
"""

from __future__ import annotations

import sys

from workers.agent.fence import open_fence
from workers.agent.runner import stop_groups


def main(argv: list[str]) -> int:
    installation, node, isolation, default_grace_s = argv[1], argv[2], argv[3], float(argv[4])
    fence = open_fence(installation, node, isolation)  # type: ignore[arg-type]
    graces: dict[tuple[int, int], float] = {}
    for raw in sys.stdin.buffer:  # ends only at EOF: the agent is gone
        word, *fields = raw.decode(errors="replace").split()
        try:
            key = (int(fields[0]), int(fields[1]))
            if word == "start":
                graces[key] = max(0.0, float(fields[2]))
            elif word == "end":
                graces.pop(key, None)
        except (IndexError, ValueError):
            continue
    groups = fence.find()
    stop_groups([(g, graces.get((g.key.job_id, g.key.attempt), default_grace_s)) for g in groups])
    for group in groups:
        group.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
