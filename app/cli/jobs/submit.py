"""gpusched submit (as sbatch: options, a script or a command, an array, --wait) and
gpusched wait."""

from __future__ import annotations

import time
from itertools import chain, repeat
from typing import Annotated, Any

import typer

from app.cli.client import (
    EXIT_REJECTED,
    EXIT_USAGE,
    OUTAGE_RIDE_OUT_S,
    ApiClient,
    CliError,
    JsonOption,
    TokenOption,
    Unreachable,
    UrlOption,
    print_json,
)
from app.cli.jobs.options import (
    JOB_PANEL,
    JOBS,
    MAX_PAGE,
    EnvOption,
    EstimatedRuntimeOption,
    ExcludeNodesOption,
    GpuMemoryOption,
    GpuModelOption,
    GpuShareOption,
    GpusOption,
    GraceOption,
    JobIds,
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
    array_spec,
    build_spec,
    parse_dependency,
)
from app.cli.jobs.views import fetch_jobs, id_ranges, name_cell, pending_text, reason_cell
from app.cli.sbatch import (
    STDIN_SCRIPT,
    stdin_script_text,
)
from app.text import escape_controls


def submit(
    ctx: typer.Context,
    command: Annotated[
        list[str] | None,
        typer.Argument(help="The program and its arguments, after `--`.", show_default=False),
    ] = None,
    shell: ShellOption = None,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            "--job-name",
            "-J",
            help="Job name (default: the program)",
            rich_help_panel=JOB_PANEL,
        ),
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
    offpeak: Annotated[bool, typer.Option("--offpeak", help="Run in an off-peak window")] = False,
    window: WindowOption = None,
    at: Annotated[
        str | None,
        typer.Option(
            "--at",
            "--begin",
            help="Do not start before this ISO 8601 time (local if no offset), as sbatch --begin",
        ),
    ] = None,
    env: EnvOption = None,
    export: Annotated[
        str | None,
        typer.Option(
            "--export",
            help="As sbatch --export: ALL (your environment, but gpusched's own settings), "
            "NAME,... (those, as set here; NAME=VALUE too) or NONE (the default: a clean one, "
            "PATH from the node). Stored with the job and shown to its project, as --env",
            show_default=False,
            rich_help_panel=JOB_PANEL,
        ),
    ] = None,
    label: LabelOption = None,
    workdir: WorkdirOption = None,
    hold: Annotated[
        bool, typer.Option("--hold", help="Submit it held: it starts once released (release ID)")
    ] = False,
    only_nodes: OnlyNodesOption = None,
    exclude_nodes: ExcludeNodesOption = None,
    notify: NotifyOption = None,
    notify_on: NotifyOnOption = None,
    after: Annotated[
        list[int] | None,
        typer.Option(
            "--after",
            help="Start only once job ID has succeeded (sbatch --dependency=afterok:ID); "
            "repeatable. If it fails, this job is cancelled",
            show_default=False,
        ),
    ] = None,
    dependency: Annotated[
        str | None,
        typer.Option(
            "--dependency",
            help="As sbatch: afterok:ID[:ID...] (= --after), afterany:ID (once it ended in "
            "any way: cleanup), afternotok:ID (only if it failed: a fallback), after:ID (once "
            "it started: a monitor beside it), or singleton "
            "(one job of yours with this name at a time, in submit order)",
            show_default=False,
        ),
    ] = None,
    array: Annotated[
        str | None,
        typer.Option(
            "--array",
            help="A job array, as sbatch --array: one job per index (0-9, 1,3,5-7, 0-15:4), "
            "at most N at once with %N (0-49%4); each reads its index from "
            "GPUSCHED_ARRAY_TASK_ID",
            show_default=False,
        ),
    ] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option("--idempotency-key", help="Resubmitting with the same key returns the job"),
    ] = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Return when the job (every task of an array) ends, with its exit "
            "status (sbatch --wait)",
        ),
    ] = False,
    parsable: Annotated[
        bool,
        typer.Option(
            "--parsable",
            help="Print only the job's id (an array's id), as sbatch --parsable: "
            "jid=$(gpusched submit --parsable train.sh)",
        ),
    ] = False,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Submit a job: `gpusched submit [OPTIONS] -- PROGRAM ARGS...`.

    A script's `#SBATCH` lines (Slurm's options) and `#GPUSCHED` lines (these) before its
    first command are options too, as for sbatch; the command line's win. Without a
    program, the script is read from standard input (`gpusched submit < train.sh`). With
    --wait, --json prints the job as it ended."""
    spec = build_spec(
        command=command,
        shell=shell,
        name=name,
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
        offpeak=offpeak,
        window=window,
        at=at,
        hold=hold,
        env=env,
        label=label,
        workdir=workdir,
        only_nodes=only_nodes,
        exclude_nodes=exclude_nodes,
        notify=notify,
        notify_on=notify_on,
        copy_script=True,
        export=export,
        stdin_script=stdin_script_text(ctx.meta.get(STDIN_SCRIPT)),
    )
    if after and dependency:
        raise CliError("give --after or --dependency, not both", EXIT_USAGE)
    if parsable and as_json:
        raise CliError("give --parsable or --json, not both", EXIT_USAGE)
    if after:
        spec["depends_on"] = after
    if dependency:
        spec["dependency"], spec["depends_on"] = parse_dependency(dependency)
    if array is not None:
        spec["array"] = array_spec(array)
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    client = ApiClient.from_options(url, token)
    response = client.request("POST", JOBS, json=spec, headers=headers)
    job = client.body(response)
    task_ids = [job["id"]]
    if job.get("array"):
        tasks, _ = fetch_jobs(
            client, {"array": job["id"], "limit": MAX_PAGE}, cursor=None, all_pages=True
        )
        task_ids = sorted(task["id"] for task in tasks)
    line = (
        str(job["id"])
        if parsable
        else _submitted_line(job, replay=response.status_code == 200, task_ids=task_ids)
    )
    if wait:
        if not as_json:
            typer.echo(line)
        raise typer.Exit(wait_for(client, task_ids, as_json=as_json, quiet=parsable))
    if as_json:
        print_json(job)
        return
    typer.echo(line)


def _submitted_line(job: dict[str, Any], *, replay: bool, task_ids: list[int]) -> str:
    verb = "already submitted" if replay else "submitted"
    array = job.get("array")
    if array:
        limit = f", at most {array['max_running']} at once" if array["max_running"] else ""
        return (
            f"{verb} array {array['id']} ({escape_controls(job['name'])}): {array['tasks']} tasks, "
            f"jobs {id_ranges(task_ids)}{limit} (gpusched jobs/cancel --array {array['id']})"
        )
    line = f"{verb} job {job['id']} ({name_cell(job)}): {job['status']}"
    if job.get("pending_message"):
        line += f" — {escape_controls(pending_text(job))}"
    if job.get("script_bytes") is not None:
        line += f"\n(it runs {job['command'][0]} as it is now: editing the file changes no job)"
    return line


ENDED = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"})


# Seconds between polls while waiting: a short job is seen ending soon, a long one costs
# a request every 15 s.
WAIT_POLLS_S = (1.0, 2.0, 5.0, 10.0, 15.0)


EXIT_INTERRUPTED = 130  # as a shell reports Ctrl-C


def _pause(seconds: float) -> None:
    time.sleep(seconds)


def wait_for(client: ApiClient, job_ids: list[int], *, as_json: bool, quiet: bool = False) -> int:
    """Poll until every job has ended, printing a line as each does (unless `quiet`, or
    `as_json`: then the jobs as they ended, at the end); the exit status is 0
    when all succeeded, else the exit code of the first that did not (1 if it has none:
    cancelled, timed out, never ran). Ctrl-C stops the waiting, not the jobs."""
    waiting = list(dict.fromkeys(job_ids))
    ended: list[dict[str, Any]] = []
    polls = chain(WAIT_POLLS_S, repeat(WAIT_POLLS_S[-1]))
    answered, unanswered_s = False, 0.0
    try:
        while True:
            try:
                for job_id in list(waiting):
                    job = client.get(f"{JOBS}/{job_id}")
                    if job["status"] in ENDED:
                        waiting.remove(job_id)
                        ended.append(job)
                        if not as_json and not quiet:
                            typer.echo(_ended_line(job))
                answered, unanswered_s = True, 0.0
            except Unreachable as exc:
                if not answered or unanswered_s >= OUTAGE_RIDE_OUT_S:
                    raise
                if not unanswered_s:
                    typer.echo(f"{exc.message}; still waiting", err=True)
                unanswered_s += WAIT_POLLS_S[-1]
                _pause(WAIT_POLLS_S[-1])
                continue
            if not waiting:
                break
            _pause(next(polls))
    except KeyboardInterrupt:
        ids = " ".join(map(str, waiting))
        typer.echo(
            f"stopped waiting; still running or pending: {ids} (gpusched cancel {ids})", err=True
        )
        return EXIT_INTERRUPTED
    if as_json:
        print_json(ended[0] if len(ended) == 1 else ended)
    failed = [j for j in ended if j["status"] != "SUCCEEDED"]
    if not failed:
        return 0
    code = failed[0].get("exit_code")
    return code if isinstance(code, int) and 0 < code < 256 else EXIT_REJECTED


def _ended_line(job: dict[str, Any]) -> str:
    reason = reason_cell(job)
    return f"job {job['id']} ({name_cell(job)}): {job['status']}" + (
        f" ({reason})" if reason else ""
    )


def wait_jobs(
    job_ids: JobIds, as_json: JsonOption = False, url: UrlOption = None, token: TokenOption = None
) -> None:
    """Wait until jobs end, like sbatch --wait: exit 0 when all succeeded, else the exit
    code of the first that did not (1 if it has none). Ctrl-C stops waiting, not the jobs."""
    raise typer.Exit(wait_for(ApiClient.from_options(url, token), job_ids, as_json=as_json))
