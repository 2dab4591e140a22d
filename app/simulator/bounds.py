"""Lower bounds on a trace's average JCT and makespan that hold for any scheduler.

The plain bounds ignore when jobs arrive: average JCT >= mean duration, makespan >=
max(longest job, GPU-seconds / GPUs). On bursty traces they are far from reachable (a
burst of a hundred jobs must queue on 64 GPUs whatever the policy), so "x times the
bound" says little. The bounds here also count the arrivals, and still hold for every
schedule, clairvoyant, preemptive and offline ones included:

- Average JCT, the mean-busy-time relaxation (Goemans, SODA 1997). Job j holds g_j GPUs
  for d_j seconds: w_j = g_j x d_j GPU-seconds of work, never faster than g_j per second.
  Its mean busy time M_j (the work-weighted average instant at which it runs) is at most
  C_j - d_j / 2, reached when it runs at full width in its last d_j seconds. Drop the
  width cap and every schedule is a fluid one on a single machine doing G GPU-seconds per
  second, where the sum of the M_j is smallest when the machine always serves the
  arrived job with the least total work (preemptive shortest first; an exchange argument:
  each job's M_j weighs its work by 1 / w_j). So sum C_j >= min sum M_j + sum d_j / 2.
- Makespan: work that arrives at or after t cannot run before t, at most G per second;
  and no job ends before its arrival plus its duration.

On one GPU with every job there from the start the JCT bound is exact (it is SJF).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import NamedTuple


class BoundJob(NamedTuple):
    arrival: float  # seconds
    gpus: float  # GPUs held while it runs (a share of a GPU counts its fraction)
    duration: float  # seconds when run alone


def mean_duration(jobs: Sequence[BoundJob]) -> float:
    """The plain bound: a job's JCT is at least its duration."""
    return sum(j.duration for j in jobs) / len(jobs) if jobs else 0.0


def avg_jct_bound(jobs: Sequence[BoundJob], total_gpus: float) -> float:
    """Average JCT no schedule of `jobs` on `total_gpus` GPUs can beat, arrivals counted:
    the larger of the mean duration and the mean-busy-time bound (module doc)."""
    if not jobs:
        return 0.0
    if total_gpus <= 0:
        raise ValueError("total_gpus must be positive")
    order = sorted(range(len(jobs)), key=lambda k: jobs[k].arrival)
    busy_sum = 0.0  # sum of the mean busy times M_j
    arrived: list[tuple[float, int]] = []  # (total work, index): least work first
    left: dict[int, float] = {}
    moment: dict[int, float] = {}  # integral of t x (rate of work) over each job's run
    t = 0.0
    nxt = 0
    n = len(order)
    while nxt < n or arrived:
        if not arrived:
            t = max(t, jobs[order[nxt]].arrival)
        while nxt < n and jobs[order[nxt]].arrival <= t:
            k = order[nxt]
            nxt += 1
            work = jobs[k].gpus * jobs[k].duration
            if work <= 0:
                busy_sum += jobs[k].arrival  # no work: done as it arrives
                continue
            left[k] = work
            moment[k] = 0.0
            heapq.heappush(arrived, (work, k))
        if not arrived:
            continue
        work, k = arrived[0]
        end = t + left[k] / total_gpus
        arrival = jobs[order[nxt]].arrival if nxt < n else end
        if end <= arrival:  # it ends before the next arrival (no float left to chase)
            heapq.heappop(arrived)
            busy_sum += (moment[k] + total_gpus * (end - t) * (end + t) / 2) / work
        else:  # served until the next arrival, which may take over
            moment[k] += total_gpus * (arrival - t) * (arrival + t) / 2
            left[k] -= total_gpus * (arrival - t)
            end = arrival
        t = end
    completion_sum = busy_sum + sum(j.duration for j in jobs) / 2
    busy_bound = (completion_sum - sum(j.arrival for j in jobs)) / n
    return max(mean_duration(jobs), busy_bound)


def makespan_bound(jobs: Sequence[BoundJob], total_gpus: float) -> float:
    """First arrival to last completion, at least: the work arriving at or after any
    arrival time, at full cluster rate from then; and each job's arrival plus duration."""
    if not jobs:
        return 0.0
    if total_gpus <= 0:
        raise ValueError("total_gpus must be positive")
    start = min(j.arrival for j in jobs)
    best = max(j.arrival + j.duration for j in jobs) - start
    later_work = 0.0
    for j in sorted(jobs, key=lambda j: j.arrival, reverse=True):
        later_work += j.gpus * j.duration
        best = max(best, j.arrival - start + later_work / total_gpus)
    return best
