"""Job x project filter: the job keeps its project within its GPU quota.

A project's quota is in whole GPUs; what its jobs hold is counted in thousandths
(a shared job holds its share on each of its GPUs). Without borrowing, a job that
would take its project past the quota waits (eligibility.py); with it, a job within
its quota may reclaim GPUs from projects running beyond theirs (preempt.py), and the
explanation says why it has not yet (explain.py). `fits` is the one test of that.
"""

from __future__ import annotations

from app.scheduling.state import Request
from app.scheduling.types import JobView


def fits(req: Request, job: JobView, used_milli: int, quota_milli: int) -> bool:
    """Whether the job's GPUs, on top of `used_milli`, stay within `quota_milli`."""
    return used_milli + req.milli * job.total_gpus <= quota_milli
