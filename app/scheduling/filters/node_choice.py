"""Job x node filter: the job's own choice of nodes, as `sbatch --exclude` and a
Kubernetes node affinity (`only_nodes`: any of them, not all of them as `--nodelist`).

`barred` answers once per job which nodes it may not use; the cycle folds that set into
the request's, so placement, the victim search and the backfill reservation all pass
over those nodes as they do over nodes going into maintenance.
"""

from __future__ import annotations

from collections.abc import Iterable

from app.scheduling.types import JobView


def chosen(job: JobView) -> bool:
    return job.only_nodes is not None or bool(job.exclude_nodes)


def barred(job: JobView, node_names: Iterable[str]) -> frozenset[str]:
    """The nodes the job may not use by its own choice."""
    only = job.only_nodes
    return frozenset(
        name
        for name in node_names
        if name in job.exclude_nodes or (only is not None and name not in only)
    )


def gone(job: JobView, node_names: Iterable[str]) -> str | None:
    """Why a job can never start where it chose to: none of its `only_nodes` is in the
    cluster any more (removed since it was submitted; the API checks the names then).
    It comes back with its node, if that registers again."""
    only = job.only_nodes
    if only is None or not only.isdisjoint(node_names):
        return None
    return (
        f"it runs only on {', '.join(sorted(only))}, and no such node is in the cluster "
        "now: change it with gpusched update --only-nodes"
    )


def note(job: JobView) -> str:
    """What the pending reason adds, so a wait its choice causes is not a mystery."""
    parts = []
    if job.only_nodes is not None:
        parts.append(f"it runs only on {', '.join(sorted(job.only_nodes))}")
    if job.exclude_nodes:
        parts.append(f"it excludes {', '.join(sorted(job.exclude_nodes))}")
    return f" ({'; '.join(parts)})"
