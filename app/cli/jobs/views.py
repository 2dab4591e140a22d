"""Reading jobs: gpusched jobs, queue and show, and the cells and tables they print."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.cells import cell_len
from rich.table import Table

from app.cli.client import (
    ApiClient,
    ApiError,
    JsonOption,
    TokenOption,
    UrlOption,
    add_row,
    age,
    console,
    format_time,
    human_duration,
    make_table,
    parse_time,
    print_json,
)
from app.cli.jobs.options import JOBS, MUST, ArrayFilterOption, LabelFilterOption, parse_pairs
from app.jobs.states import SINGLETON
from app.text import escape_controls


def id_ranges(ids: list[int]) -> str:
    """[12, 13, 14, 20] -> "12-14,20": an array's job ids are mostly consecutive."""
    runs: list[list[int]] = []
    for job_id in ids:
        if runs and job_id == runs[-1][-1] + 1:
            runs[-1].append(job_id)
        else:
            runs.append([job_id])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _gpus_cell(job: dict[str, Any]) -> str:
    share = job.get("gpu_share")
    per_node = f"{share:g}" if share is not None and share < 1 else str(job["gpus"])
    return per_node if job.get("nodes", 1) == 1 else f"{per_node}x{job['nodes']}"


def name_cell(job: dict[str, Any]) -> str:
    """An array task shows its index, as Slurm's 12_3: the tasks share one name. A control
    character in it is written out (`\x1b`), not sent to the terminal."""
    array = job.get("array")
    name = escape_controls(str(job["name"]))
    return f"{name}[{array['index']}]" if array else name


def pending_text(job: dict[str, Any]) -> str:
    """The pending message, with the time it waits for (pending_until) in the CLI's style:
    the API gives the time as data, not in the text."""
    text = str(job.get("pending_message") or job.get("pending_reason") or "")
    if job.get("pending_until"):
        text += f"; waits until {format_time(job['pending_until'])}"
    return text


def reason_cell(job: dict[str, Any]) -> str:
    if job["status"] == "PENDING":  # it may name other jobs, by their names
        return escape_controls(pending_text(job))
    if job.get("exit_code") is not None:
        return f"exit {job['exit_code']}"
    if job["status"] == "TIMED_OUT" and job.get("max_runtime_s"):
        return f"max runtime {human_duration(job['max_runtime_s'])}"  # Slurm's TIMEOUT
    if job["status"] in ("SCHEDULED", "RUNNING"):
        if job.get("cancel_requested"):
            return "cancel requested"
        if job.get("requeue_requested"):  # requeued by its owner, or preempted
            return "stopping, then back in the queue"
    return ""


def _one_line_per_job(
    columns: tuple[str, ...], rows: Sequence[tuple[str, ...]], *, width: int
) -> Table:
    """One line per job, as squeue: the REASON column gets what the other columns leave of
    `width` and ends in "…" when longer (`gpusched show ID` and --json have it whole);
    wrapped, one reason took a dozen lines at 80 columns."""
    flex = columns.index("REASON")
    table = make_table(*columns)
    # Each column takes its widest cell plus 3 (padding and border), the table 1 more.
    others = sum(
        max(cell_len(name), *(cell_len(row[i]) for row in rows)) + 3
        for i, name in enumerate(columns)
        if i != flex
    )
    reason = table.columns[flex]
    reason.no_wrap, reason.overflow = True, "ellipsis"
    reason.max_width = max(10, width - others - 4)
    if any(cell_len(row[flex]) > reason.max_width for row in rows):
        table.caption = "reasons cut to fit: gpusched show ID has them whole"
        table.caption_justify = "left"
    for row in rows:
        add_row(table, *row)
    return table


def jobs_table(items: list[dict[str, Any]], *, width: int) -> Table:
    rows = [
        (
            str(job["id"]),
            name_cell(job),
            str(job["project"]),
            str(job["user"]),
            str(job["status"]),
            _gpus_cell(job),
            reason_cell(job),
            age(job.get("created_at")),
        )
        for job in items
    ]
    columns = ("ID", "NAME", "PROJECT", "USER", "STATUS", "GPUS", "REASON", "AGE")
    return _one_line_per_job(columns, rows, width=width)


def queue_table(items: list[dict[str, Any]], *, width: int, now: datetime) -> Table:
    """Pending jobs in scheduling order, as `squeue --start`: START is when the backfill
    reservation expects the job to start, blank when nothing running has a known end."""
    rows = [
        (
            str(job.get("queue_position") or ""),
            str(job["id"]),
            name_cell(job),
            str(job["project"]),
            str(job["user"]),
            _gpus_cell(job),
            _start_cell(job.get("estimated_start_at"), now=now),
            reason_cell(job),
        )
        for job in items
    ]
    columns = ("POS", "ID", "NAME", "PROJECT", "USER", "GPUS", "START", "REASON")
    return _one_line_per_job(columns, rows, width=width)


def _start_cell(value: str | None, *, now: datetime) -> str:
    at = parse_time(value)
    if at is None:
        return ""
    return "now" if at <= now else f"in {human_duration((at - now).total_seconds())}"


def pending_queue(
    project: Annotated[str | None, typer.Option(help="Only this project")] = None,
    user: Annotated[
        str | None, typer.Option("--user", "-u", help="Only this user's jobs (squeue -u)")
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", "-n", help="Only jobs of this name (squeue --name)")
    ] = None,
    limit: Annotated[int, typer.Option(help="Jobs to show, from the head of the queue")] = 50,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Pending jobs in the order the scheduler considers them, with the estimated start
    and why each waits (as squeue --start). --json prints {"total": N, "items": [...]}."""
    params: dict[str, Any] = {"limit": limit}
    params.update({k: v for k, v in (("project", project), ("user", user), ("name", name)) if v})
    page = ApiClient.from_options(url, token).get("/api/v1/queue", params=params)
    if as_json:
        print_json(page)
        return
    out = console()
    if not page["items"]:
        out.print("no pending jobs")
        return
    out.print(queue_table(page["items"], width=out.width, now=datetime.now(UTC)))
    if page["total"] > len(page["items"]):
        more = page["total"] - len(page["items"])
        out.print(f"{more} more pending: a larger --limit shows them", style="dim")


def list_jobs(
    status: Annotated[
        list[str] | None,
        typer.Option(
            "--status",
            "-t",
            help="PENDING, RUNNING, ... (repeatable; squeue -t)",
            show_default=False,
        ),
    ] = None,
    project: Annotated[str | None, typer.Option(help="Only this project")] = None,
    user: Annotated[
        str | None, typer.Option("--user", "-u", help="Only this user's jobs (squeue -u)")
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", "-n", help="Only jobs of this name (squeue --name)")
    ] = None,
    label: LabelFilterOption = None,
    array: ArrayFilterOption = None,
    limit: Annotated[int, typer.Option(help="Jobs per page (newest first)")] = 50,
    cursor: Annotated[
        str | None, typer.Option(help="Start at this next_cursor of an earlier page")
    ] = None,
    all_pages: Annotated[
        bool, typer.Option("--all", help="Follow next_cursor through every page")
    ] = False,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """List jobs, newest first. --json prints {"items": [...], "next_cursor": ...}."""
    parse_pairs(label, "--label")  # usage error before any request
    client = ApiClient.from_options(url, token)
    params: dict[str, Any] = {
        "status": [s.upper() for s in status or []],
        "label": list(label or []),
        "limit": limit,
    }
    if project:
        params["project"] = project
    if user:
        params["user"] = user
    if array is not None:
        params["array"] = array
    if name:
        params["name"] = name
    items, next_cursor = fetch_jobs(client, params, cursor=cursor, all_pages=all_pages)
    if as_json:
        print_json({"items": items, "next_cursor": next_cursor})
        return
    out = console()
    if not items:
        out.print("no jobs")
    else:
        out.print(jobs_table(items, width=out.width))
    if next_cursor:
        out.print(f"more: --cursor {next_cursor} (or --all)", style="dim")


def fetch_jobs(
    client: ApiClient, params: dict[str, Any], *, cursor: str | None, all_pages: bool
) -> tuple[list[dict[str, Any]], str | None]:
    """GET /jobs from `cursor` on: one page, or every page; and the cursor of the next."""
    items: list[dict[str, Any]] = []
    while True:
        page = client.get(JOBS, params={**params, "cursor": cursor} if cursor else params)
        items.extend(page["items"])
        cursor = page.get("next_cursor")
        if not all_pages or not cursor:
            return items, cursor


def _command_text(command: list[str] | str) -> str:
    return shlex.join(command) if isinstance(command, list) else f"sh -c {shlex.quote(command)}"


def _job_details(job: dict[str, Any], rank: dict[str, Any] | None = None) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    rows: list[tuple[str, object]] = [
        ("id", job["id"]),
        ("name", job["name"]),
        ("status", job["status"] + (" (cancel requested)" if job["cancel_requested"] else "")),
        ("user / project", f"{job['user']} / {job['project']}"),
        ("command", _command_text(job["command"])),
        *(
            [("script", f"the copy taken at submission ({job['script_bytes']} bytes; --script)")]
            if job.get("script_bytes") is not None
            else []
        ),
        ("workdir", job.get("workdir") or ""),
        ("gpus", _gpus_cell(job) + (f" {job['gpu_model']}" if job.get("gpu_model") else "")),
    ]
    if job.get("gpu_memory_mb"):
        rows.append(("gpu memory", f"{job['gpu_memory_mb']} MiB"))
    if job.get("only_nodes"):
        rows.append(("only on", ", ".join(job["only_nodes"])))
    if job.get("exclude_nodes"):
        rows.append(("excludes", ", ".join(job["exclude_nodes"])))
    if job.get("notify_url"):
        rows.append(("notifies", f"{job['notify_url']} on {', '.join(job['notify_on'])}"))
    rows.append(("priority", job["priority"]))
    rows.append(("preemptible", "yes" if job["preemptible"] else "no"))
    schedule = job.get("schedule") or {}
    mode = schedule.get("mode", "now")
    if mode == "offpeak":
        mode += f" (window {schedule['window']})" if schedule.get("window") else ""
    elif mode == "at":
        mode += f" {format_time(schedule.get('at'))}"
    rows.append(("schedule", mode))
    if job.get("array"):
        array = job["array"]
        limit = f", at most {array['max_running']} at once" if array["max_running"] else ""
        rows.append(
            (
                "array",
                f"task {array['index']} of array {array['id']} ({array['tasks']} tasks{limit})",
            )
        )
    if job.get("depends_on"):
        must = MUST.get(job.get("dependency", "afterok"), "")
        rows.append(("depends on", ", ".join(map(str, job["depends_on"])) + f" ({must})"))
    elif job.get("dependency") == SINGLETON:
        rows.append(("depends on", f"singleton: one job named {job['name']!r} of yours at a time"))
    if job.get("max_runtime_s"):
        rows.append(("max runtime", human_duration(job["max_runtime_s"])))
    if job.get("estimated_runtime_s"):
        rows.append(("estimated runtime", human_duration(job["estimated_runtime_s"])))
    if job.get("grace_s") is not None:
        grace = job["grace_s"]
        shown = human_duration(grace) if grace % 60 == 0 else f"{grace}s"  # 90s, not 1m
        rows.append(("grace", f"{shown} from SIGTERM to SIGKILL"))
    rows.append(("attempt", f"{job['attempt']} (failures {job['failures']}/{job['retries']})"))
    if job["status"] == "PENDING":  # the API gives a reason to pending jobs only
        rows.append(("pending reason", job.get("pending_reason") or ""))
        rows.append(("pending message", pending_text(job) if job.get("pending_message") else ""))
    if job.get("queue_position") is not None:
        rows.append(("queue position", job["queue_position"]))
    if rank is not None:  # as sprio: why the jobs ahead go first, at the last full cycle
        rows.append(("queue rank", f"{rank['message']} (policy {rank['policy']})"))
    if job.get("estimated_start_at"):
        rows.append(("estimated start", format_time(job["estimated_start_at"])))
    elif job.get("estimate_note"):  # a waiting job: why it has none
        rows.append(("estimated start", job["estimate_note"]))
    if job.get("exit_code") is not None:
        rows.append(("exit code", job["exit_code"]))
    if job.get("labels"):
        rows.append(("labels", ", ".join(f"{k}={v}" for k, v in sorted(job["labels"].items()))))
    if job.get("env"):
        rows.append(("env", "\n".join(_env_line(k, v) for k, v in sorted(job["env"].items()))))
    for key in ("created_at", "scheduled_at", "started_at", "finished_at"):
        if job.get(key):
            rows.append((key.removesuffix("_at"), format_time(job[key])))
    for label, value in rows:
        add_row(table, label, value)
    return table


def _env_line(name: str, value: str | None) -> str:
    # The API gives a value only to the job's owner and admins (an exported environment
    # holds the submitter's keys); the others learn the names.
    return f"{name}={value}" if value is not None else f"{name} (value hidden: not your job)"


def show(
    job_id: Annotated[int, typer.Argument(help="Job id", show_default=False)],
    script: Annotated[
        bool,
        typer.Option(
            "--script",
            help="Print only the script it runs, as submitted (scontrol write batch_script)",
        ),
    ] = False,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Show one job: spec, pending reason, queue position and why the jobs ahead go first
    (as sprio), allocations, events and how its notifications were delivered.

    --json prints the job object with "events", "notifications" and "rank" (null unless
    it waits in the queue) added."""
    client = ApiClient.from_options(url, token)
    if script:
        typer.echo(client.request("GET", f"{JOBS}/{job_id}/script").text, nl=False)
        return
    job = client.get(f"{JOBS}/{job_id}")
    events = client.get(f"{JOBS}/{job_id}/events")
    notifications = client.get(f"{JOBS}/{job_id}/notifications")
    rank = _rank(client, job)
    if as_json:
        print_json({**job, "events": events, "notifications": notifications, "rank": rank})
        return
    out = console()
    out.print(_job_details(job, rank))
    if job.get("allocations"):
        alloc = make_table("NODE", "GPU", "SHARE", "RANK", title="Allocations")
        for a in job["allocations"]:
            add_row(alloc, a["node"], a["gpu_index"], f"{a['share']:g}", a["rank"])
        out.print(alloc)
    if events:
        table = make_table("AT", "FROM", "TO", "ATTEMPT", "ACTOR", "REASON", title="Events")
        for e in events:
            add_row(
                table,
                format_time(e["at"]),
                e.get("from_status") or "",
                e["to_status"],
                e["attempt"],
                e["actor"],
                e["reason"],
            )
        out.print(table)
    if notifications:
        sent = make_table(
            "EVENT", "URL", "STATE", "TRIES", "WHEN", "LAST ERROR", title="Notifications"
        )
        for n in notifications:
            when = format_time(n["sent_at"] or n["next_at"])
            state = n["state"].replace("_", " ")
            add_row(sent, n["event"], n["url"], state, n["attempts"], when, n["error"] or "")
        out.print(sent)


def _rank(client: ApiClient, job: dict[str, Any]) -> dict[str, Any] | None:
    """A waiting job's place in the queue and why (GET /jobs/{id}/rank); None when it is
    not ranked (held, waiting for its dependencies, or placed meanwhile)."""
    if job["status"] != "PENDING" or job.get("held_by"):
        return None
    try:
        rank: dict[str, Any] = client.get(f"{JOBS}/{job['id']}/rank")
    except ApiError as exc:
        if exc.status_code != 409:
            raise
        return None
    return rank
