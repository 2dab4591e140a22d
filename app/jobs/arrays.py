"""Job arrays, as sbatch --array: one submission, many tasks that differ only by index.

A sweep of 50 learning rates is one request (`"array": {"indices": "0-49",
"max_running": 4}`, `gpusched submit --array 0-49%4`). Each task is a job of its own
(queued, placed, retried and cancelled like any other) that knows its index from
GPUSCHED_ARRAY_TASK_ID. The array's id is its first task's job id, as in Slurm.

`max_running` is Slurm's `%N` throttle: at most N tasks hold GPUs at once, so a sweep
cannot take the whole cluster. Phase 0 of a cycle (app/cycle/arrays.py) lets only that
many into the queue; the others wait with the reason `array_limit`.

Everything here is pure.
"""

from __future__ import annotations

import re

MAX_TASKS = 1000  # Slurm's default MaxArraySize is 1001
MAX_INDEX = 99_999

_PART = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")
_SLURM_FORM = re.compile(r"^(?P<indices>[^%]+)(?:%(?P<max_running>\d+))?$")

# Environment every task gets; the agent's own GPUSCHED_JOB_ID is the task's job id.
ARRAY_JOB_ID_ENV = "GPUSCHED_ARRAY_JOB_ID"
ARRAY_TASK_ID_ENV = "GPUSCHED_ARRAY_TASK_ID"
ARRAY_TASK_COUNT_ENV = "GPUSCHED_ARRAY_TASK_COUNT"


def parse_indices(text: str) -> tuple[int, ...]:
    """Slurm's index syntax: "0-9", "1,3,5-7", "0-15:4" (step). Sorted, each index once.

    Raises ValueError with a message fit for the user."""
    indices: set[int] = set()
    for part in text.replace(" ", "").split(","):
        match = _PART.match(part)
        if match is None:
            raise ValueError(
                f"{part!r} is not an index or a range: use e.g. '0-9', '1,3,5-7' or '0-15:4'"
            )
        first = int(match[1])
        last = int(match[2]) if match[2] is not None else first
        step = int(match[3]) if match[3] is not None else 1
        if last < first:
            raise ValueError(f"range {part!r} ends before it starts")
        if step < 1:
            raise ValueError(f"range {part!r}: the step must be at least 1")
        if last > MAX_INDEX:
            raise ValueError(f"index {last} is above the largest allowed, {MAX_INDEX}")
        if (last - first) // step + 1 + len(indices) > MAX_TASKS:
            raise ValueError(f"more than {MAX_TASKS} tasks")
        indices.update(range(first, last + 1, step))
    return tuple(sorted(indices))


def split_slurm_form(text: str) -> tuple[str, int | None]:
    """ "0-9%2" -> ("0-9", 2), as sbatch --array writes the throttle."""
    match = _SLURM_FORM.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r}: expected indices with an optional %N, e.g. '0-9%2'")
    limit = match["max_running"]
    return match["indices"], None if limit is None else int(limit)


def throttle_message(*, array_id: int, max_running: int) -> str:
    """Why a task waits outside the queue: its array's slots are taken (by tasks running,
    or queued ahead of it). Counts would be stale once the cycle places those."""
    tasks = "1 task" if max_running == 1 else f"{max_running} tasks"
    return f"array {array_id} runs at most {tasks} at once: waiting for one of its tasks to end"
