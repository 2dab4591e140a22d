"""Job x node filter: the job's owner has a Unix account the node can run it as.

A root agent runs each job as its owner's account (``unix_user``); one that does not
exist on a node, or that the node may not use (uid 0 not allowed), is reported by its
agent (``NodeView.unusable_accounts``). The owner's jobs are placed elsewhere: `barred`
folds those nodes into the request's barred set, as a job's own choice of nodes is; when
no node is left, the job waits with the reason, naming each node and why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from app.scheduling.types import JobView, NodeView

# account -> {node: why it cannot be used there}
Lacking = Mapping[str, Mapping[str, str]]


def lacking(nodes: Iterable[NodeView]) -> dict[str, dict[str, str]]:
    """Which nodes cannot run which owners' accounts, once per cycle."""
    found: dict[str, dict[str, str]] = {}
    for node in nodes:
        for account, why in node.unusable_accounts:
            found.setdefault(account, {})[node.name] = why
    return found


def barred(job: JobView, lacks: Lacking) -> frozenset[str]:
    """The nodes that cannot run the job as its owner's account."""
    if job.unix_user is None:
        return frozenset()
    return frozenset(lacks.get(job.unix_user, ()))


def reason(job: JobView, lacks: Lacking) -> str:
    """Why a job waits when the nodes left to it cannot run it as its owner's account."""
    where = lacks.get(job.unix_user or "", {})
    nodes = "; ".join(f"{node}: {why}" for node, why in sorted(where.items()))
    return (
        f"no node it may use can run it as Unix account {job.unix_user!r} ({nodes}): "
        "create the account there, or map the user to another (gpusched admin "
        "set-unix-user)"
    )


def note(job: JobView, lacks: Lacking) -> str:
    """What the pending reason adds when some nodes cannot run it as its owner."""
    where = sorted(lacks.get(job.unix_user or "", ()))
    return f" (no usable Unix account {job.unix_user!r} on {', '.join(where)})" if where else ""
