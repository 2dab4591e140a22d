"""Cluster commands: nodes, queues, quota, drain, undrain, audit."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

import typer

from app.cli.client import (
    EXIT_USAGE,
    ApiClient,
    CliError,
    JsonOption,
    TokenOption,
    UrlOption,
    add_row,
    age,
    console,
    count_or_none,
    format_time,
    human_duration,
    make_table,
    parse_at,
    print_json,
)
from app.cli.jobs.options import parse_duration

NODES = "/api/v1/nodes"
QUEUES = "/api/v1/queues"
PROJECTS = "/api/v1/projects"
AUDIT = "/api/v1/audit"

NodeName = Annotated[str, typer.Argument(help="Node name", show_default=False)]


def _node_state(node: dict[str, Any]) -> str:
    if node["drained"]:
        return f"{node['state']},DRAINED"
    if node.get("maintenance_at"):
        return f"{node['state']},MAINT"  # as sinfo's MAINT: a maintenance is planned
    return str(node["state"])


def _gpu_models(node: dict[str, Any]) -> str:
    counts: dict[str, int] = {}
    for gpu in node.get("gpus", []):
        counts[gpu["model"]] = counts.get(gpu["model"], 0) + 1
    return ", ".join(f"{n}x {model}" for model, n in sorted(counts.items()))


def jobs_run_as(node: dict[str, Any]) -> str:
    """Whose account a node runs jobs as."""
    user = node.get("jobs_run_as")
    return "each its owner's" if user is None else f"single-user: jobs run as {user}"


def _node_note(node: dict[str, Any]) -> str:
    notes = []
    if node["drained"] and node.get("drain_reason"):
        notes.append(f"drained: {node['drain_reason']}")
    elif node.get("maintenance_at"):
        notes.append(
            f"maintenance from {format_time(node['maintenance_at'])}, until then only jobs whose "
            f"time limit ends by then: {node.get('drain_reason', '')}"
        )
    if node.get("health_message"):
        notes.append(node["health_message"])
    unusable = node.get("unusable_accounts") or {}
    if unusable:
        notes.append(
            "cannot run jobs as " + ", ".join(f"{a} ({why})" for a, why in sorted(unusable.items()))
        )
    for gpu in node.get("gpus", []):
        if not gpu.get("healthy", True):
            notes.append(f"GPU {gpu['index']} unhealthy: {gpu.get('health_message') or '?'}")
        elif gpu.get("unknown_readings"):
            notes.append(f"GPU {gpu['index']} unknown: {'; '.join(gpu['unknown_readings'])}")
        elif gpu.get("mig_enabled"):
            notes.append(f"GPU {gpu['index']} MIG enabled (not scheduled)")
    busy = [g["index"] for g in node.get("gpus", []) if g.get("foreign_util_pct", 0) > 0]
    if busy:
        notes.append("foreign load on GPU " + ",".join(str(i) for i in busy))
    return "; ".join(notes)


def nodes(as_json: JsonOption = False, url: UrlOption = None, token: TokenOption = None) -> None:
    """List nodes: state, GPUs allocated, models, how jobs are fenced and whose account
    they run as, last heartbeat."""
    items = ApiClient.from_options(url, token).get(NODES)
    if as_json:
        print_json(items)
        return
    if not items:
        console().print("no nodes registered")
        return
    table = make_table(
        "NAME", "STATE", "GPUS USED", "MODELS", "ISOLATION", "JOBS RUN AS", "HEARTBEAT", "NOTES"
    )
    for node in items:
        add_row(
            table,
            node["name"],
            _node_state(node),
            f"{node['gpus_allocated']:g}/{node['gpu_count']}",
            _gpu_models(node),
            node.get("isolation") or "-",
            jobs_run_as(node),
            f"{age(node.get('last_heartbeat_at'))} ago"
            if node.get("last_heartbeat_at")
            else "never",
            _node_note(node),
        )
    console().print(table)


def queues(as_json: JsonOption = False, url: UrlOption = None, token: TokenOption = None) -> None:
    """Per-project queues: pending and running jobs, GPUs requested and in use, quota, and
    fair-share standing (as sshare): each project's part of the weights (SHARE) against
    its part of the recent, decayed GPU use (USED). A project above its share has its
    jobs ranked later."""
    items = ApiClient.from_options(url, token).get(QUEUES)
    if as_json:
        print_json(items)
        return
    if not items:
        console().print("no queues")
        return
    table = make_table(
        "PROJECT",
        "PENDING",
        "RUNNING",
        "GPUS REQUESTED",
        "GPUS IN USE",
        "QUOTA",
        "WEIGHT",
        "SHARE",
        "USED",
    )
    for q in items:
        used = q["usage_share"]
        add_row(
            table,
            q["project"],
            f"{q['pending']} ({q['held']} held)" if q["held"] else q["pending"],
            q["running"],
            q["gpus_requested"],
            f"{q['gpus_in_use']:g}",
            q["gpu_quota"] or "-",
            f"{q['weight']:g}",
            f"{q['fair_share']:.0%}",
            "-" if used is None else f"{used:.0%} ({q['usage_gpu_hours']:.1f} GPU-h)",
        )
    console().print(table)


def quota(
    project: Annotated[str, typer.Argument(help="Project name", show_default=False)],
    gpus: Annotated[
        int | None,
        typer.Option(
            "--gpus",
            min=0,
            help="GPUs guaranteed to the project (0: none, it only borrows idle GPUs)",
            show_default=False,
        ),
    ] = None,
    weight: Annotated[
        float | None,
        typer.Option(
            help="Fair-share weight relative to other projects (default of a new project: 1)",
            show_default=False,
        ),
    ] = None,
    max_runtime: Annotated[
        str | None,
        typer.Option(
            "--max-runtime",
            help="Longest time limit of its jobs (as a QOS's MaxWall): 4h, 2d, ... or none "
            "(the cluster's). A job that sets none gets the cluster's default, cut to this",
            show_default=False,
        ),
    ] = None,
    max_priority: Annotated[
        int | None,
        typer.Option(
            "--max-priority",
            min=0,
            max=1000,
            help="Highest priority its users may give their jobs (0: they may only lower "
            "it, as Slurm's nice); admins give any",
            show_default=False,
        ),
    ] = None,
    max_pending: Annotated[
        str | None,
        typer.Option(
            "--max-pending",
            help="Jobs (array tasks each) its users may have pending together, as Slurm's "
            "GrpSubmitJobs, or none (no limit of its own)",
            show_default=False,
        ),
    ] = None,
    max_running: Annotated[
        str | None,
        typer.Option(
            "--max-running",
            help="Jobs its users may run at once together, as Slurm's GrpJobs (more wait), "
            "or none (no limit of its own)",
            show_default=False,
        ),
    ] = None,
    max_gpus: Annotated[
        str | None,
        typer.Option(
            "--max-gpus",
            help="GPUs its users' running jobs may use together, as Slurm's "
            "GrpTRES=gres/gpu (more wait), or none (no limit of its own)",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Set a project's guaranteed GPUs, fair-share weight, longest job time limit, the
    highest priority its users may give, how many jobs they may have pending and run at
    once and how many GPUs they may use together (admin).

    Others may borrow its idle guaranteed GPUs; preemptible borrowers are requeued for it.

    Applies from the next cycle; after a cut, its jobs above the quota count as borrowed.
    A time limit applies to jobs submitted or changed from then on.
    """
    asked = (gpus, weight, max_runtime, max_priority, max_pending, max_running, max_gpus)
    if all(value is None for value in asked):
        raise CliError(
            "give --gpus, --weight, --max-runtime, --max-priority, --max-pending, "
            "--max-running or --max-gpus (`gpusched queues --json` shows the current values)",
            EXIT_USAGE,
        )
    given = (("gpu_quota", gpus), ("weight", weight), ("max_priority", max_priority))
    body: dict[str, Any] = {k: v for k, v in given if v is not None}
    if max_runtime is not None:
        cleared = max_runtime.strip().lower() == "none"
        body["max_runtime_s"] = None if cleared else parse_duration(max_runtime, "--max-runtime")
    if max_pending is not None:
        body["max_pending_jobs"] = count_or_none(max_pending, "--max-pending")
    if max_running is not None:
        body["max_running_jobs"] = count_or_none(max_running, "--max-running")
    if max_gpus is not None:
        body["max_gpus"] = count_or_none(max_gpus, "--max-gpus")
    client = ApiClient.from_options(url, token)
    result = client.patch(f"{PROJECTS}/{quote(project, safe='')}", json=body)
    if gpus:
        _note_overcommit(client)
    if as_json:
        print_json(result)
        return
    guarantee = f"{result['gpu_quota']} GPUs guaranteed" if result["gpu_quota"] else "no guarantee"
    longest = result["max_runtime_s"]
    limit = f", jobs at most {human_duration(longest)}" if longest else ""
    highest = result["max_priority"]
    priority = f", users give priority up to {highest}" if highest else ""
    most = result["max_pending_jobs"]
    pending = f" of at most {most:,}" if most is not None else ""
    at_once = result.get("max_running_jobs")
    running = f", at most {at_once:,} jobs running at once" if at_once is not None else ""
    most_gpus = result.get("max_gpus")
    gpu_cap = f" of at most {most_gpus:,}" if most_gpus is not None else ""
    typer.echo(
        f"project {result['project']}: {guarantee}, fair-share weight {result['weight']:g}"
        f"{limit}{priority}{running} ({result['gpus_in_use']:g} GPUs in use{gpu_cap}, "
        f"{result['pending']} jobs pending{pending})"
    )


def _note_overcommit(client: ApiClient) -> None:
    """Guarantees above the cluster's size are allowed (as in Kueue and Slurm): say so."""
    guaranteed = sum(q["gpu_quota"] for q in client.get(QUEUES))
    gpus = sum(n["gpu_count"] for n in client.get(NODES))
    if guaranteed > gpus:
        typer.echo(
            f"note: guarantees now sum to {guaranteed} GPUs, more than the cluster's {gpus}:"
            " they cannot all be honoured at once",
            err=True,
        )


def drain(
    node: NodeName,
    reason: Annotated[str, typer.Option(help="Why (shown in `gpusched nodes`)")] = "",
    at: Annotated[
        str | None,
        typer.Option(
            "--at",
            help="Drain from this ISO 8601 time on (local if no offset): maintenance, as a "
            "Slurm maint reservation. Until then only jobs whose time limit ends by then "
            "start on the node",
            show_default=False,
        ),
    ] = None,
    requeue: Annotated[
        bool,
        typer.Option(
            "--requeue",
            help="Also stop its running jobs and put them back in the queue, to run "
            "elsewhere: each gets its grace period to checkpoint, no retry is spent",
        ),
    ] = False,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Stop placing new jobs on a node (admin); running jobs finish normally, or with
    --requeue move elsewhere. With --at, later: a maintenance. --json prints the node (and
    with --requeue, the jobs)."""
    if at is not None and requeue:
        raise CliError(
            "--at and --requeue exclude each other: jobs that started before the "
            "maintenance was planned may still run into it; requeue them when it begins",
            EXIT_USAGE,
        )
    body: dict[str, str] = {"reason": reason} if reason else {}
    if at is not None:
        body["at"] = parse_at(at).isoformat()
    client = ApiClient.from_options(url, token)
    path = f"{NODES}/{quote(node, safe='')}"
    result = client.post(f"{path}/drain", json=body or None)
    moved = client.post(f"{path}/requeue") if requeue else None
    if as_json:
        print_json(result if moved is None else {"node": result, "requeued": moved})
        return
    if not result["drained"] and result.get("maintenance_at"):
        typer.echo(
            f"node {result['name']}: maintenance from {format_time(result['maintenance_at'])}; "
            f"until then only jobs whose time limit ends by then start there "
            f"({result['drain_reason']})"
        )
        return
    typer.echo(f"node {result['name']} drained: {result['drain_reason']}")
    if moved is not None:
        names = ", ".join(f"{job['id']} ({job['name']})" for job in moved)
        typer.echo(
            f"requeued jobs {names}: they stop within their grace period and run elsewhere"
            if moved
            else "no job was running there"
        )


def undrain(
    node: NodeName,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Let the scheduler place jobs on a drained node again (admin)."""
    result = ApiClient.from_options(url, token).post(f"{NODES}/{quote(node, safe='')}/undrain")
    if as_json:
        print_json(result)
        return
    typer.echo(f"node {result['name']} is schedulable again ({result['state']})")


def remove_node(
    node: NodeName,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Remove a decommissioned node (admin), as `kubectl delete node`: it leaves `nodes`,
    the dashboard, the metrics and scheduling; jobs that ran there keep their history.
    Refused while its agent heartbeats or a job holds its GPUs. Its agent registering
    again brings it back."""
    client = ApiClient.from_options(url, token)
    result = client.body(client.request("DELETE", f"{NODES}/{quote(node, safe='')}"))
    if as_json:
        print_json(result)
        return
    typer.echo(
        f"node {result['name']} removed ({result['gpu_count']} GPUs); "
        "its agent registering again brings it back"
    )


def audit(
    target: Annotated[
        str | None,
        typer.Argument(
            help="Only changes to this project, node, window or user", show_default=False
        ),
    ] = None,
    action: Annotated[
        str | None,
        typer.Option(
            help="Only this action, e.g. project.update or node.drain", show_default=False
        ),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="How many (newest first)")] = 50,
    before: Annotated[
        int | None, typer.Option(min=1, help="Only changes older than this id (paging)")
    ] = None,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Who changed what (admin): quotas and weights, project membership, users and tokens,
    drains, off-peak windows and cron batches, newest first (as `sacctmgr list
    transactions`)."""
    wanted = {"limit": limit, "target": target, "action": action, "before": before}
    params = {k: v for k, v in wanted.items() if v is not None}
    page = ApiClient.from_options(url, token).get(AUDIT, params=params)
    if as_json:
        print_json(page)
        return
    if not page["items"]:
        console().print("no administrative changes recorded" + (f" for {target}" if target else ""))
        return
    table = make_table("AT", "ACTOR", "ACTION", "TARGET", "CHANGE")
    for event in page["items"]:
        add_row(
            table,
            format_time(event["at"]),
            event["actor"],
            event["action"],
            event["target"],
            event["summary"],
        )
    console().print(table)
    if page["next_before"] is not None:
        console().print(f"older changes: --before {page['next_before']}", style="dim")


def register(app: typer.Typer) -> None:
    app.command("nodes", rich_help_panel="Cluster")(nodes)
    app.command("queues", rich_help_panel="Cluster")(queues)
    app.command("quota", rich_help_panel="Cluster")(quota)
    app.command("drain", rich_help_panel="Cluster")(drain)
    app.command("undrain", rich_help_panel="Cluster")(undrain)
    app.command("remove-node", rich_help_panel="Cluster")(remove_node)
    app.command("audit", rich_help_panel="Cluster")(audit)
