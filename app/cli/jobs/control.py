"""Changing jobs that exist: gpusched cancel, hold, release, requeue and update, one job or
a selection (by state, user, label, array)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from app.cli.client import (
    EXIT_REJECTED,
    EXIT_USAGE,
    ApiClient,
    ApiError,
    CliError,
    JsonOption,
    TokenOption,
    UrlOption,
    print_json,
)
from app.cli.jobs.options import (
    EXCLUDE_HELP,
    JOBS,
    ONLY_NODES_HELP,
    ArrayFilterOption,
    JobIds,
    LabelFilterOption,
    OptionalJobIds,
    TimeOption,
    duration_option,
    node_names,
    notify_events,
    number_or_none,
    parse_dependency,
    parse_duration,
    parse_pairs,
    runtime_limit_s,
)
from app.cli.jobs.views import id_ranges, name_cell, pending_text
from app.text import escape_controls


def _each_job(
    job_ids: list[int],
    action: str,
    line: Callable[[dict[str, Any]], str],
    *,
    client: ApiClient,
    as_json: bool,
    params: dict[str, Any] | None = None,
) -> None:
    """POST /jobs/ID/`action` (with `params`) for every id: one line each, errors per id on
    stderr, exit 1 if any failed. --json prints the job, or a list of jobs for several."""
    ids = list(dict.fromkeys(job_ids))
    done, failed = [], 0
    for job_id in ids:
        try:
            job = client.post(f"{JOBS}/{job_id}/{action}", params=params)
        except ApiError as exc:
            if len(ids) == 1:
                raise
            typer.echo(f"error: job {job_id}: {exc.message}", err=True)
            failed += 1
            continue
        done.append(job)
        if not as_json:
            typer.echo(line(job))
    if as_json:
        print_json(done[0] if len(ids) == 1 else done)
    if failed:
        raise typer.Exit(EXIT_REJECTED)


UserFilterOption = Annotated[
    str | None, typer.Option("--user", "-u", help="Every job of this user (scancel -u)")
]


NameFilterOption = Annotated[
    str | None, typer.Option("--name", "-n", help="Every job of this name (squeue --name)")
]


ProjectFilterOption = Annotated[str | None, typer.Option(help="Every job in this project")]


def cancel(
    job_ids: OptionalJobIds = None,
    user: UserFilterOption = None,
    name: NameFilterOption = None,
    project: ProjectFilterOption = None,
    status: Annotated[
        list[str] | None,
        typer.Option(
            "--status",
            "-t",
            help="Only in these states (default: any a job has not ended in; scancel -t)",
            show_default=False,
        ),
    ] = None,
    label: LabelFilterOption = None,
    array: ArrayFilterOption = None,
    grace: Annotated[
        str | None,
        typer.Option(
            "--grace",
            help="Stop running jobs with this grace period if sooner than their own: 0 kills "
            "at once (SIGKILL). Again on a job already stopping, it cuts its grace short",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Cancel jobs (idempotent), like scancel 12 13, or the jobs the options select, like
    scancel -u alice -t PENDING; --array 12 cancels every task of array 12 that has not
    ended. A running job is stopped by its agent: SIGTERM, its grace period, SIGKILL.

    Every job is tried; exit 1 if any could not be cancelled. --json prints the job, or a
    list of jobs for several."""
    selection = _selection_params(job_ids, user, project, status, label, array, name=name)
    grace_s = duration_option(grace, "--grace")
    client = ApiClient.from_options(url, token)
    shorter = {} if grace_s is None else {"grace_s": grace_s}
    _by_ids_or_selection(
        "cancel",
        job_ids,
        selection,
        id_line=_cancel_id_line,
        nothing="no jobs match",
        client=client,
        as_json=as_json,
        params=shorter,
    )


def hold(
    job_ids: OptionalJobIds = None,
    user: UserFilterOption = None,
    name: NameFilterOption = None,
    project: ProjectFilterOption = None,
    label: LabelFilterOption = None,
    array: ArrayFilterOption = None,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Keep pending jobs from starting until released, like scontrol hold 12 13, or every
    pending job the options select; --array 12 holds every pending task of array 12.

    Every id is tried; exit 1 if any could not be held (e.g. it is already running)."""
    selection = _selection_params(job_ids, user, project, None, label, array, name=name)
    _by_ids_or_selection(
        "hold",
        job_ids,
        selection,
        id_line=_hold_line,
        nothing="no pending jobs match",
        client=ApiClient.from_options(url, token),
        as_json=as_json,
    )


def release(
    job_ids: OptionalJobIds = None,
    user: UserFilterOption = None,
    name: NameFilterOption = None,
    project: ProjectFilterOption = None,
    label: LabelFilterOption = None,
    array: ArrayFilterOption = None,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Let held jobs be scheduled again, like scontrol release 12 13, or every held job
    the options select; --array 12 releases every held task of array 12. A hold placed by
    an admin only an admin releases."""
    selection = _selection_params(job_ids, user, project, None, label, array, name=name)
    _by_ids_or_selection(
        "release",
        job_ids,
        selection,
        id_line=_hold_line,
        nothing="no held jobs match",
        client=ApiClient.from_options(url, token),
        as_json=as_json,
    )


def _selection_params(
    job_ids: list[int] | None,
    user: str | None,
    project: str | None,
    status: list[str] | None,
    label: list[str] | None,
    array: int | None,
    name: str | None = None,
) -> dict[str, Any] | None:
    """The query of a bulk action (POST /jobs/cancel, /hold, /release: the filters of GET
    /jobs), or None when jobs are named by id. Ids and filters together, or neither, is a
    usage error, raised before any request."""
    selecting = bool(user or project or status or label or name or array is not None)
    if job_ids and selecting:
        raise CliError(
            "give job ids or filter options (--user, --array, ...), not both", EXIT_USAGE
        )
    if not job_ids and not selecting:
        raise CliError("no jobs: give job ids or select them with --user, --array, ...", EXIT_USAGE)
    if job_ids:
        return None
    parse_pairs(label, "--label")
    return {
        "status": [s.upper() for s in status or ()],
        "label": list(label or []),
        **({"user": user} if user else {}),
        **({"project": project} if project else {}),
        **({"array": array} if array is not None else {}),
        **({"name": name} if name else {}),
    }


def _by_ids_or_selection(
    action: str,
    job_ids: list[int] | None,
    selection: dict[str, Any] | None,
    *,
    id_line: Callable[[dict[str, Any]], str],
    nothing: str,
    client: ApiClient,
    as_json: bool,
    params: dict[str, Any] | None = None,
) -> None:
    """POST /jobs/ID/`action` for each job named, or, for a `selection`, /jobs/`action`
    once: one transaction for them all (as scancel -u alice). Its answer is how many and
    which (the API's counts and ids with --json), on one line; none: `nothing` on stderr,
    exit 0."""
    if selection is None:
        _each_job(job_ids or [], action, id_line, client=client, as_json=as_json, params=params)
        return
    done = client.post(f"{JOBS}/{action}", params=selection | (params or {}))
    if as_json:
        print_json(done)
    elif not done["count"]:
        typer.echo(nothing, err=True)
    else:
        typer.echo(_bulk_line(BULK_DONE[action], done))


# What each bulk action did, as its one line says it.
BULK_DONE = {"cancel": "cancelled", "hold": "held", "release": "released", "update": "updated"}


def _bulk_line(done: str, answer: dict[str, Any]) -> str:
    """ "cancelled 3 jobs: 12-14 (1 still stopping)": the API lists the first ids only."""
    count = answer["count"]
    line = f"{done} {count} job{'s' if count != 1 else ''}: {id_ranges(answer['ids'])}"
    if answer["more"]:
        line += f" and {answer['more']} more"
    if answer.get("stopping"):
        line += f" ({answer['stopping']} still stopping: cancel requested)"
    return line


def update(
    job_id: Annotated[
        int | None, typer.Argument(help="Job id (or select jobs with --array, --user, ...)")
    ] = None,
    name: Annotated[str | None, typer.Option(help="New name")] = None,
    gpus: Annotated[int | None, typer.Option(help="GPUs per node")] = None,
    gpu_memory_mb: Annotated[
        str | None,
        typer.Option("--gpu-memory-mb", help="Free GPU memory needed per GPU, MiB, or none"),
    ] = None,
    nodes: Annotated[int | None, typer.Option(help="Nodes")] = None,
    priority: Annotated[int | None, typer.Option(help="-1000..1000")] = None,
    max_runtime: Annotated[
        str | None, typer.Option("--max-runtime", help="Hard limit: 2h, 90m, ... or none")
    ] = None,
    time_limit: TimeOption = None,
    estimated_runtime: Annotated[
        str | None,
        typer.Option("--estimated-runtime", help="Expected runtime: 2h, 90m, ... or none"),
    ] = None,
    grace: Annotated[
        str | None,
        typer.Option("--grace", help="SIGTERM-to-SIGKILL time: 5m, 90s, ... or none"),
    ] = None,
    array_limit: Annotated[
        str | None,
        typer.Option(
            "--array-limit",
            help="Tasks of the job's array that may run at once, or none (scontrol update "
            "ArrayTaskThrottle); any task's id will do, in any state",
            show_default=False,
        ),
    ] = None,
    only_nodes: Annotated[
        str | None,
        typer.Option("--only-nodes", help=f"{ONLY_NODES_HELP}; none: any node"),
    ] = None,
    exclude_nodes: Annotated[
        str | None, typer.Option("--exclude", "-x", help=f"{EXCLUDE_HELP}; none: no node")
    ] = None,
    dependency: Annotated[
        str | None,
        typer.Option(
            "--dependency",
            help="Wait for other jobs instead, as submit's --dependency (afterok:ID[:ID...], "
            "afterany:ID, afternotok:ID, after:ID, singleton), or none to wait for none",
            show_default=False,
        ),
    ] = None,
    notify: Annotated[
        str | None,
        typer.Option(
            "--notify", help="POST its notifications to this URL instead, or none for no more"
        ),
    ] = None,
    notify_on: Annotated[
        str | None,
        typer.Option(
            "--notify-on",
            help="start, end, fail, requeue; comma-separated (scontrol update MailType=). A "
            "job without a URL then posts to its owner's default",
        ),
    ] = None,
    user: UserFilterOption = None,
    project: ProjectFilterOption = None,
    label: LabelFilterOption = None,
    array: ArrayFilterOption = None,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Change a pending job, like scontrol update: `gpusched update 12 --gpus 4 --priority 10`,
    or every pending job the options select: --array 12 changes all its pending tasks, in
    one transaction (a change refused for one changes none).

    It keeps its submit time, so its place by age; cancel and resubmit would lose it.
    --array-limit changes the whole array the job is a task of. A running job takes only
    --max-runtime (scontrol update TimeLimit=): you may shorten it, only an admin extend it."""
    ids = None if job_id is None else [job_id]
    selection = _selection_params(ids, user, project, None, label, array)
    limit_of = job_id if job_id is not None else array
    if array_limit is not None and limit_of is None:
        raise CliError("--array-limit needs a job id or --array", EXIT_USAGE)
    changes: dict[str, Any] = {
        k: v
        for k, v in {
            "name": name,
            "gpus": gpus,
            "nodes": nodes,
            "priority": priority,
        }.items()
        if v is not None
    }
    if time_limit is not None:  # "none" (scontrol's UNLIMITED) clears it, as --max-runtime's
        cleared = time_limit.strip().lower() in ("none", "unlimited") and max_runtime is None
        changes["max_runtime_s"] = None if cleared else runtime_limit_s(max_runtime, time_limit)
    for field, value, option in (
        ("max_runtime_s", max_runtime, "--max-runtime"),
        ("estimated_runtime_s", estimated_runtime, "--estimated-runtime"),
        ("grace_s", grace, "--grace"),
    ):
        if value is not None:  # "none" clears it
            cleared = value.strip().lower() == "none"
            changes[field] = None if cleared else parse_duration(value, option)
    if gpu_memory_mb is not None:  # "none": any GPU with room, as when submitted without
        changes["gpu_memory_mb"] = number_or_none(gpu_memory_mb, "--gpu-memory-mb")
    for field, names, option in (
        ("only_nodes", only_nodes, "--only-nodes"),
        ("exclude_nodes", exclude_nodes, "--exclude"),
    ):
        if names is not None:  # "none" clears the choice
            cleared = names.strip().lower() == "none"
            changes[field] = None if cleared else node_names(names, option)
    if notify is not None:
        changes["notify_url"] = None if notify.strip().lower() == "none" else notify
    if notify_on is not None:
        changes["notify_on"] = notify_events(notify_on)
    if dependency is not None:
        kind, ids = (
            ("afterok", [])
            if dependency.strip().lower() == "none"
            else parse_dependency(dependency)
        )
        changes |= {"dependency": kind, "depends_on": ids}
    limit = number_or_none(array_limit, "--array-limit") if array_limit is not None else None
    if not changes and array_limit is None:
        raise CliError("nothing to change: give at least one option (see --help)", EXIT_USAGE)
    client = ApiClient.from_options(url, token)
    lines = []
    answer: Any = None
    if changes and selection is not None:
        answer = client.patch(JOBS, params=selection, json=changes)
        if answer["count"]:
            lines.append(_bulk_line(BULK_DONE["update"], answer))
        else:
            typer.echo("no pending jobs match", err=True)
    elif changes:
        answer = client.patch(f"{JOBS}/{job_id}", json=changes)
        lines.append(_updated_line(answer))
    if array_limit is not None:
        job = client.patch(f"{JOBS}/{limit_of}/array", json={"max_running": limit})
        if answer is None or "count" not in answer:  # --json: a selection's counts, or the job
            answer = job
        at_once = f"at most {limit} at once" if limit else "no limit"
        lines.append(f"updated array {job['array']['id']}: {at_once}")
    if as_json:
        print_json(answer)
        return
    if lines:
        typer.echo("\n".join(lines))


def _updated_line(job: dict[str, Any]) -> str:
    line = f"updated job {job['id']} ({name_cell(job)}): {job['status']}"
    if job.get("pending_message"):
        line += f" — {escape_controls(pending_text(job))}"
    return line


def requeue(
    job_ids: JobIds,
    hold_it: Annotated[
        bool,
        typer.Option(
            "--hold",
            help="Bring it back held (scontrol requeuehold): change it with update, then "
            "release it",
        ),
    ] = False,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Stop placed or running jobs and put them back in the queue, like scontrol requeue
    12: each gets SIGTERM and its grace period to checkpoint, costs no retry and keeps its
    place by age. To run a job on other GPUs, or with more of them: requeue --hold, update,
    release.

    Every id is tried; exit 1 if any could not be requeued (e.g. it is still pending)."""
    client = ApiClient.from_options(url, token)
    _each_job(
        job_ids,
        "requeue",
        _requeue_line,
        client=client,
        as_json=as_json,
        params={"hold": "true"} if hold_it else None,
    )


def _requeue_line(job: dict[str, Any]) -> str:
    back = f"held by {escape_controls(job['held_by'])}" if job.get("held_by") else "in the queue"
    return f"job {job['id']} ({name_cell(job)}): stopping, then back {back}"


def _hold_line(job: dict[str, Any]) -> str:
    state = f"held by {escape_controls(job['held_by'])}" if job.get("held_by") else job["status"]
    return f"job {job['id']} ({name_cell(job)}): {state}"


def _cancel_id_line(job: dict[str, Any]) -> str:
    """`cancel 12` where 12 is an array's id cancels task 0 alone, unlike Slurm's scancel
    of an array id: say how to cancel the rest."""
    array = job.get("array")
    if array and array["id"] == job["id"] and array["tasks"] > 1:
        return (
            f"{_cancel_line(job)}; task 0 only: `gpusched cancel --array {job['id']}` "
            f"cancels the array's {array['tasks']} tasks"
        )
    return _cancel_line(job)


def _cancel_line(job: dict[str, Any]) -> str:
    if job["status"] == "CANCELLED":
        return f"job {job['id']} ({name_cell(job)}): CANCELLED"
    if job.get("cancel_requested"):
        return f"job {job['id']} ({name_cell(job)}): cancel requested, still {job['status']}"
    return f"job {job['id']} ({name_cell(job)}): {job['status']}"
