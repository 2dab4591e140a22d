"""Cron batch commands: `gpusched batch list|create|show|run|delete|enable|disable`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer
from rich.table import Table

from app.cli.client import (
    EXIT_USAGE,
    ApiClient,
    CliError,
    JsonOption,
    TokenOption,
    UrlOption,
    add_row,
    console,
    format_time,
    make_table,
    print_json,
)
from app.cli.jobs.options import (
    JOB_PANEL,
    EnvOption,
    EstimatedRuntimeOption,
    ExcludeNodesOption,
    GpuMemoryOption,
    GpuModelOption,
    GpuShareOption,
    GpusOption,
    GraceOption,
    LabelOption,
    MaxRuntimeOption,
    NodesOption,
    NotifyOnOption,
    NotifyOption,
    OnlyNodesOption,
    PreemptibleOption,
    PriorityOption,
    ProjectOption,
    RetriesOption,
    ShellOption,
    TimeOption,
    WindowOption,
    WorkdirOption,
    build_spec,
)

BATCHES = "/api/v1/batches"

batch_app = typer.Typer(
    name="batch",
    help="Cron batches: job sets submitted at local wall-clock times (fired by the scheduler).",
    no_args_is_help=True,
)

BatchName = Annotated[str, typer.Argument(help="Batch name (a slug)", show_default=False)]


def _path(name: str, *rest: str) -> str:
    return "/".join([BATCHES, quote(name, safe=""), *rest])


def load_templates(path: str) -> list[dict[str, Any]]:
    """Templates from a JSON file: one job object, a list of them, or {"templates": [...]}."""
    try:
        text = Path(path).read_text() if path != "-" else typer.get_text_stream("stdin").read()
    except OSError as exc:
        raise CliError(f"--template-file: cannot read {path}: {exc.strerror}", EXIT_USAGE) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CliError(f"--template-file: {path} is not JSON: {exc}", EXIT_USAGE) from None
    if isinstance(data, dict) and "templates" in data:
        data = data["templates"]
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(t, dict) for t in data):
        raise CliError(
            f"--template-file: {path}: expected a job object or a list of job objects",
            EXIT_USAGE,
        )
    return data


def _target(batch: dict[str, Any]) -> str:
    if batch["target"] == "offpeak" and batch.get("window"):
        return f"offpeak ({batch['window']})"
    return str(batch["target"])


def _batches_table(items: list[dict[str, Any]]) -> Table:
    table = make_table(
        "NAME", "OWNER", "CRON", "TIMEZONE", "JOBS", "TARGET", "ENABLED", "NEXT", "LAST"
    )
    for b in items:
        add_row(
            table,
            b["name"],
            b["owner"],
            b["cron"],
            b["timezone"],
            len(b["templates"]),
            _target(b),
            "yes" if b["enabled"] else "no",
            format_time(b.get("next_fire_at"), zone=b["timezone"]),
            format_time(b.get("last_fired_at"), zone=b["timezone"]),
        )
    return table


@batch_app.command("list")
def list_batches(
    as_json: JsonOption = False, url: UrlOption = None, token: TokenOption = None
) -> None:
    """List batches with their next and last fire times (in each batch's zone)."""
    items = ApiClient.from_options(url, token).get(BATCHES)
    if as_json:
        print_json(items)
        return
    console().print(_batches_table(items) if items else "no batches")


@batch_app.command("create")
def create(
    name: BatchName,
    command: Annotated[
        list[str] | None,
        typer.Argument(
            help="A single job's program and arguments, after `--`.", show_default=False
        ),
    ] = None,
    cron: Annotated[
        str, typer.Option("--cron", help="5-field cron of local fire times, e.g. '0 2 * * *'")
    ] = ...,  # type: ignore[assignment]
    tz: Annotated[str, typer.Option("--tz", help="IANA time zone of the cron")] = "UTC",
    offpeak: Annotated[
        bool, typer.Option("--offpeak", help="Hold the jobs for the next off-peak window")
    ] = False,
    window: WindowOption = None,
    catch_up: Annotated[
        str,
        typer.Option(
            "--catch-up", help="After downtime: once (run the latest missed time) or skip"
        ),
    ] = "once",
    concurrency: Annotated[
        str,
        typer.Option(
            "--concurrency",
            help="A fire time while jobs of an earlier firing have not ended: allow (submit "
            "anyway), forbid (skip it) or replace (cancel them, then submit)",
        ),
    ] = "allow",
    disabled: Annotated[bool, typer.Option("--disabled", help="Create it disabled")] = False,
    replace: Annotated[
        bool,
        typer.Option("--replace", help="Replace the batch of this name (its history stays)"),
    ] = False,
    template_file: Annotated[
        list[str] | None,
        typer.Option(
            "--template-file",
            help="JSON: a job object, a list, or {\"templates\": [...]}; '-' = stdin (repeatable)",
            show_default=False,
        ),
    ] = None,
    shell: ShellOption = None,
    job_name: Annotated[
        str | None, typer.Option("--job-name", help="Job name", rich_help_panel=JOB_PANEL)
    ] = None,
    gpus: GpusOption = None,
    gpu_memory_mb: GpuMemoryOption = None,
    gpu_share: GpuShareOption = None,
    gpu_model: GpuModelOption = None,
    nodes: NodesOption = None,
    priority: PriorityOption = None,
    project: ProjectOption = None,
    max_runtime: MaxRuntimeOption = None,
    time_limit: TimeOption = None,
    estimated_runtime: EstimatedRuntimeOption = None,
    grace: GraceOption = None,
    retries: RetriesOption = None,
    preemptible: PreemptibleOption = False,
    env: EnvOption = None,
    label: LabelOption = None,
    workdir: WorkdirOption = None,
    only_nodes: OnlyNodesOption = None,
    exclude_nodes: ExcludeNodesOption = None,
    notify: NotifyOption = None,
    notify_on: NotifyOnOption = None,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Create (or --replace) a batch: `gpusched batch create NAME --cron '0 2 * * *' --tz
    Europe/Berlin [--offpeak] [--template-file jobs.json] [--gpus 4 -- PROGRAM ARGS...]`.

    The Job options describe the job given after `--` (or with --shell)."""
    if window is not None and not offpeak:
        raise CliError("--window needs --offpeak", EXIT_USAGE)
    if catch_up not in ("once", "skip"):
        raise CliError("--catch-up must be once or skip", EXIT_USAGE)
    if concurrency not in ("allow", "forbid", "replace"):
        raise CliError("--concurrency must be allow, forbid or replace", EXIT_USAGE)
    templates: list[dict[str, Any]] = []
    for path in template_file or []:
        templates.extend(load_templates(path))
    if command or shell is not None:
        templates.append(
            build_spec(
                command=command,
                shell=shell,
                name=job_name,
                gpus=gpus,
                gpu_memory_mb=gpu_memory_mb,
                gpu_share=gpu_share,
                gpu_model=gpu_model,
                nodes=nodes,
                priority=priority,
                project=project,
                max_runtime=max_runtime,
                time_limit=time_limit,
                estimated_runtime=estimated_runtime,
                grace=grace,
                retries=retries,
                preemptible=preemptible,
                env=env,
                label=label,
                workdir=workdir,
                only_nodes=only_nodes,
                exclude_nodes=exclude_nodes,
                notify=notify,
                notify_on=notify_on,
            )
        )
    if not templates:
        raise CliError("no jobs: give --template-file FILE and/or a command after `--`", EXIT_USAGE)
    body: dict[str, Any] = {
        "name": name,
        "cron": cron,
        "timezone": tz,
        "templates": templates,
        "target": "offpeak" if offpeak else "now",
        "catch_up": catch_up,
        "concurrency": concurrency,
        "enabled": not disabled,
    }
    if window:
        body["window"] = window
    client = ApiClient.from_options(url, token)
    batch = client.put(_path(name), json=body) if replace else client.post(BATCHES, json=body)
    if as_json:
        print_json(batch)
        return
    nxt = format_time(batch.get("next_fire_at"), zone=batch["timezone"]) or "never (disabled)"
    typer.echo(
        f"{'replaced' if replace else 'created'} batch {batch['name']}:"
        f" {len(batch['templates'])} job(s) at "
        f"'{batch['cron']}' {batch['timezone']}, next {nxt}"
    )


def _overlap(concurrency: str) -> str:
    return {
        "allow": "allow (a firing submits even if earlier jobs have not ended)",
        "forbid": "forbid (a firing is skipped while earlier jobs have not ended)",
        "replace": "replace (a firing cancels earlier jobs that have not ended)",
    }[concurrency]


def _details(batch: dict[str, Any]) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    rows: list[tuple[str, object]] = [
        ("name", batch["name"]),
        ("owner / project", f"{batch['owner']} / {batch['project']}"),
        ("cron", f"{batch['cron']} ({batch['timezone']})"),
        ("target", _target(batch)),
        ("catch up", batch["catch_up"]),
        ("overlap", _overlap(batch["concurrency"])),
        ("enabled", "yes" if batch["enabled"] else "no"),
        ("next fire", format_time(batch.get("next_fire_at"), zone=batch["timezone"])),
        ("last fired", format_time(batch.get("last_fired_at"), zone=batch["timezone"])),
        ("created", format_time(batch["created_at"])),
    ]
    for i, t in enumerate(batch["templates"]):
        command = t["command"] if isinstance(t["command"], str) else " ".join(t["command"])
        after = f", after job {', '.join(map(str, t['after']))}" if t.get("after") else ""
        array = t.get("array")
        if array:
            limit = f"%{array['max_running']}" if array.get("max_running") else ""
            after = f", array {array['indices']}{limit}{after}"
        rows.append(
            (f"job {i}", f"{command} (gpus {t.get('gpus', 1)}, project {t['project']}{after})")
        )
    for label, value in rows:
        add_row(table, label, value)
    return table


@batch_app.command("show")
def show(
    name: BatchName,
    limit: Annotated[int, typer.Option(help="Firings to show (newest first)")] = 20,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Show a batch, its job templates and its recent firings.

    --json prints the batch object with its firings under "firings"."""
    client = ApiClient.from_options(url, token)
    batch = client.get(_path(name))
    firings = client.get(_path(name, "firings"), params={"limit": limit})
    if as_json:
        print_json({**batch, "firings": firings})
        return
    out = console()
    out.print(_details(batch))
    if firings:
        table = make_table("FIRE TIME", "JOB IDS", "NOTE", title="Firings")
        for f in firings:
            note = f.get("error") or ""
            if f["skipped"]:
                note = f"skipped: {note}" if note else "skipped (late)"
            elif f.get("run_by"):
                note = f"run by {f['run_by']}"
            add_row(
                table,
                format_time(f["fire_at"], zone=batch["timezone"]),
                ",".join(str(j) for j in f["job_ids"]),
                note,
            )
        out.print(table)
    else:
        out.print("no firings yet")


@batch_app.command("run")
def run(
    name: BatchName, as_json: JsonOption = False, url: UrlOption = None, token: TokenOption = None
) -> None:
    """Submit a batch's jobs now, by hand (kubectl create job --from=cronjob/NAME), also
    while it is disabled; its own fire times stay as they were. Its overlap policy applies:
    forbid refuses while jobs of an earlier firing have not ended, replace cancels them."""
    firing = ApiClient.from_options(url, token).post(_path(name, "run"))
    if as_json:
        print_json(firing)
        return
    ids = firing["job_ids"]
    typer.echo(f"batch {name} ran: job{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}")


@batch_app.command("delete")
def delete(name: BatchName, url: UrlOption = None, token: TokenOption = None) -> None:
    """Delete a batch and its firing history (jobs it submitted stay)."""
    ApiClient.from_options(url, token).request("DELETE", _path(name))
    typer.echo(f"deleted batch {name}")


def _set_enabled(name: str, action: str, as_json: bool, url: str | None, token: str | None) -> None:
    batch = ApiClient.from_options(url, token).post(_path(name, action))
    if as_json:
        print_json(batch)
        return
    state = f"enabled, next {batch['next_fire_at']}" if batch["enabled"] else "disabled"
    typer.echo(f"batch {batch['name']}: {state}")


@batch_app.command("enable")
def enable(
    name: BatchName, as_json: JsonOption = False, url: UrlOption = None, token: TokenOption = None
) -> None:
    """Enable a batch; fire times while it was disabled do not run."""
    _set_enabled(name, "enable", as_json, url, token)


@batch_app.command("disable")
def disable(
    name: BatchName, as_json: JsonOption = False, url: UrlOption = None, token: TokenOption = None
) -> None:
    """Disable a batch (it keeps its history)."""
    _set_enabled(name, "disable", as_json, url, token)


def register(app: typer.Typer) -> None:
    app.add_typer(batch_app, name="batch", rich_help_panel="Jobs")
