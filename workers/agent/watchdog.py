"""Takes a node's jobs down when their agent dies.

    python -m workers.agent.watchdog NODE GRACE_S    (stdin: a pipe held by the agent)

A job that outlives its agent (kill -9, OOM killer) keeps its GPUs busy while the
scheduler, seeing the node silent, requeues it elsewhere: the same job would run twice.
The agent starts this process with a pipe as its stdin and never writes to it; the kernel
closes the pipe when the agent exits in any way, the read below returns, and every
process group this node's agent started (found by GPUSCHED_NODE in their environment) gets
SIGTERM, the grace period, then SIGKILL. On a clean shutdown the agent has stopped its
jobs already, so there is nothing left to kill.
"""

from __future__ import annotations

import sys

from workers.agent.runner import find_leftover_processes, kill_process_groups, leftover_graces


def main(argv: list[str]) -> int:
    node, grace_s = argv[1], float(argv[2])
    sys.stdin.buffer.read()  # returns only at EOF: the agent is gone
    kill_process_groups(leftover_graces(find_leftover_processes(node=node), grace_s))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
