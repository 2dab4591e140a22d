"""Job commands: submit, jobs, queue, show, update, wait, cancel, hold, release."""

from __future__ import annotations

import os
import re
import shlex
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from itertools import chain, repeat
from typing import Annotated, Any, get_args

import typer
from rich.cells import cell_len
from rich.table import Table

from app.cli.client import (
    EXIT_REJECTED,
    EXIT_USAGE,
    OUTAGE_RIDE_OUT_S,
    ApiClient,
    ApiError,
    CliError,
    JsonOption,
    TokenOption,
    Unreachable,
    UrlOption,
    add_row,
    age,
    console,
    human_duration,
    make_table,
    parse_at,
    parse_time,
    print_json,
)
from app.cli.sbatch import (
    STDIN_NAME,
    STDIN_SCRIPT,
    ScriptCommand,
    exported_env,
    job_command,
    stdin_script_text,
)
from app.jobs.arrays import parse_indices, split_slurm_form
from app.jobs.states import SINGLETON, DependencyKind
from app.text import escape_controls

JOBS = "/api/v1/jobs"
MAX_PAGE = 500

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_duration(value: str, what: str = "duration") -> int:
    """Seconds from '3600', '90m', '2h', '1h30m', '1d12h' or '45s'."""
    text = value.strip().lower()
    if text.isdigit():
        return int(text)
    match = _DURATION.match(text)
    if not text or match is None or not any(match.groups()):
        raise CliError(
            f"{what}: {value!r}: expected seconds or a duration like 90m, 2h, 1h30m", EXIT_USAGE
        )
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return days * 86400 + hours * 3600 + minutes * 60 + seconds


# sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_slurm_time(value: str, what: str = "--time") -> int:
    """Seconds from a time limit as sbatch --time writes it (a bare number is minutes),
    or as --max-runtime does when it has units (2h, 1h30m)."""
    text = value.strip()
    match = _SLURM_TIME.match(text)
    if match is None:
        if text[-1:].isalpha() and _DURATION.match(text.lower()):
            return parse_duration(text, what)
        raise CliError(
            f"{what}: {value!r}: expected minutes, MM:SS, HH:MM:SS or D-HH:MM:SS (as sbatch "
            "--time), or a duration like 2h",
            EXIT_USAGE,
        )
    days, first, second, third = match.groups()
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = int(first), int(second or 0), int(third or 0)
        return int(days) * 86400 + hours * 3600 + minutes * 60 + seconds
    if second is None:
        return int(first) * 60  # minutes
    if third is None:
        return int(first) * 60 + int(second)  # MM:SS
    return int(first) * 3600 + int(second) * 60 + int(third)


def _time_limit(max_runtime: str | None, time_limit: str | None) -> int | None:
    """--max-runtime or its sbatch spelling --time, not both."""
    if max_runtime is not None and time_limit is not None:
        raise CliError("--max-runtime and --time are the same limit: give one", EXIT_USAGE)
    if time_limit is not None:
        return parse_slurm_time(time_limit)
    return _duration_option(max_runtime, "--max-runtime")


def _duration_option(value: str | None, what: str) -> int | None:
    return None if value is None else parse_duration(value, what)


def parse_pairs(values: list[str] | None, what: str) -> dict[str, str]:
    """['K=V', ...] -> {K: V}; the value may be empty or contain '='."""
    pairs: dict[str, str] = {}
    for item in values or []:
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise CliError(f"{what}: {item!r}: expected KEY=VALUE", EXIT_USAGE)
        pairs[key] = val
    return pairs


def node_names(text: str, option: str) -> list[str]:
    """Node names from "n1,n2" (spaces allowed)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise CliError(f"{option}: expected node names, e.g. node-1,node-2", EXIT_USAGE)
    return names


ONLY_NODES_HELP = (
    "Run only on these nodes, any of them: node-1,node-2 (not all of them, as sbatch "
    "--nodelist would)"
)
EXCLUDE_HELP = "Never run on these nodes, as sbatch --exclude: node-3,node-4"


def build_spec(
    *,
    command: list[str] | None,
    shell: str | None,
    name: str | None,
    gpus: int | None,
    gpu_memory_mb: int | None,
    gpu_share: float | None,
    gpu_model: str | None,
    nodes: int | None,
    priority: int | None,
    project: str | None,
    max_runtime: str | None,
    estimated_runtime: str | None,
    grace: str | None,
    retries: int | None,
    preemptible: bool,
    env: list[str] | None,
    label: list[str] | None,
    workdir: str | None,
    offpeak: bool = False,
    window: str | None = None,
    at: str | None = None,
    hold: bool = False,
    only_nodes: str | None = None,
    exclude_nodes: str | None = None,
    notify: str | None = None,
    notify_on: str | None = None,
    time_limit: str | None = None,
    copy_script: bool = False,
    export: str | None = None,
    stdin_script: str | None = None,
) -> dict[str, Any]:
    """The JobCreate body. Only what the user set is sent: the server owns the defaults and
    the range checks (so its 422 names the field exactly as the API does). `copy_script`:
    a script is sent along and run as it is now (submit, as sbatch), not as it is when the
    job starts (a cron batch's template)."""
    if command and shell is not None:
        raise CliError("give either --shell or a command after --, not both", EXIT_USAGE)
    if not command and shell is None and stdin_script is None:
        raise CliError(
            "no command: use `gpusched submit [OPTIONS] -- PROGRAM ARGS...` or --shell 'CMD'",
            EXIT_USAGE,
        )
    if offpeak and at is not None:
        raise CliError("--offpeak and --at exclude each other", EXIT_USAGE)
    if window is not None and not offpeak:
        raise CliError("--window needs --offpeak", EXIT_USAGE)

    workdir = os.path.abspath(workdir) if workdir else os.getcwd()
    spec: dict[str, Any] = {"command": shell}
    if stdin_script is not None:  # the script came on standard input: it is the command
        spec["command"], spec["script"] = [STDIN_NAME], stdin_script
    elif command:
        spec["command"], script = job_command(command, workdir, copy=copy_script)
        if script is not None:
            spec["script"] = script
    optional = {
        "name": name,
        "gpus": gpus,
        "gpu_memory_mb": gpu_memory_mb,
        "gpu_share": gpu_share,
        "gpu_model": gpu_model,
        "nodes": nodes,
        "priority": priority,
        "project": project,
        "max_runtime_s": _time_limit(max_runtime, time_limit),
        "estimated_runtime_s": _duration_option(estimated_runtime, "--estimated-runtime"),
        "grace_s": _duration_option(grace, "--grace"),
        "retries": retries,
    }
    spec.update({k: v for k, v in optional.items() if v is not None})
    if only_nodes is not None:
        spec["only_nodes"] = node_names(only_nodes, "--only-nodes")
    if exclude_nodes is not None:
        spec["exclude_nodes"] = node_names(exclude_nodes, "--exclude")
    if notify is not None:
        spec["notify_url"] = notify
    if notify_on is not None:
        spec["notify_on"] = notify_events(notify_on)
    if preemptible:
        spec["preemptible"] = True
    if hold:
        spec["hold"] = True
    if offpeak:
        spec["schedule"] = {"mode": "offpeak", **({"window": window} if window else {})}
    elif at is not None:
        spec["schedule"] = {"mode": "at", "at": parse_at(at).isoformat()}
    env_vars = {**exported_env(export or "NONE", os.environ), **parse_pairs(env, "--env")}
    if env_vars:
        spec["env"] = env_vars
    labels = parse_pairs(label, "--label")
    if labels:
        spec["labels"] = labels
    spec["workdir"] = workdir
    return spec


# The options of one job, shared by `submit` and `batch create` (its job given on the
# command line); the server owns their defaults and range checks.
JOB_PANEL = "Job"
ShellOption = Annotated[
    str | None,
    typer.Option(
        "--shell",
        "--wrap",
        help="Run this string with /bin/sh -c instead (sbatch --wrap)",
        rich_help_panel=JOB_PANEL,
    ),
]
GpusOption = Annotated[
    int | None, typer.Option(help="GPUs per node (default: 1)", rich_help_panel=JOB_PANEL)
]
GpuMemoryOption = Annotated[
    int | None,
    typer.Option(
        "--gpu-memory-mb", help="Free GPU memory needed per GPU, MiB", rich_help_panel=JOB_PANEL
    ),
]
GpuShareOption = Annotated[
    float | None,
    typer.Option(
        "--gpu-share", help="Fraction of one GPU (0 < share <= 1)", rich_help_panel=JOB_PANEL
    ),
]
GpuModelOption = Annotated[
    str | None,
    typer.Option(
        "--gpu-model",
        help="GPU model: the cluster's name, or words of it that name one model (h100)",
        rich_help_panel=JOB_PANEL,
    ),
]
NodesOption = Annotated[
    int | None,
    typer.Option(
        "--nodes", "-N", help="Nodes (distributed job) (default: 1)", rich_help_panel=JOB_PANEL
    ),
]
PriorityOption = Annotated[
    int | None, typer.Option(help="-1000..1000 (default: 0)", rich_help_panel=JOB_PANEL)
]
ProjectOption = Annotated[
    str | None, typer.Option(help="Project (default: your only project)", rich_help_panel=JOB_PANEL)
]
MaxRuntimeOption = Annotated[
    str | None,
    typer.Option(
        "--max-runtime", help="Hard limit: seconds, 90m, 2h, 1h30m", rich_help_panel=JOB_PANEL
    ),
]
TimeOption = Annotated[
    str | None,
    typer.Option(
        "--time",
        "-t",
        help="The hard limit as sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH:MM:SS (or 2h); "
        "the same as --max-runtime",
        rich_help_panel=JOB_PANEL,
        show_default=False,
    ),
]
EstimatedRuntimeOption = Annotated[
    str | None,
    typer.Option(
        "--estimated-runtime",
        help="Expected runtime: seconds, 90m, 2h, 1h30m",
        rich_help_panel=JOB_PANEL,
    ),
]
GraceOption = Annotated[
    str | None,
    typer.Option(
        "--grace",
        help="Time from SIGTERM to SIGKILL when the job is stopped (cancel, preemption, time "
        "limit), to checkpoint: seconds, 90s, 5m (default: the node agent's, 30s); the job "
        "reads it in GPUSCHED_GRACE_S",
        rich_help_panel=JOB_PANEL,
    ),
]
RetriesOption = Annotated[
    int | None, typer.Option(help="Retries after a failure (default: 0)", rich_help_panel=JOB_PANEL)
]
PreemptibleOption = Annotated[
    bool,
    typer.Option(
        "--preemptible", help="May be preempted by higher-priority work", rich_help_panel=JOB_PANEL
    ),
]
WindowOption = Annotated[
    str | None, typer.Option("--window", help="Off-peak window name (with --offpeak)")
]
EnvOption = Annotated[
    list[str] | None,
    typer.Option(
        "--env", help="KEY=VALUE, repeatable", show_default=False, rich_help_panel=JOB_PANEL
    ),
]
LabelOption = Annotated[
    list[str] | None,
    typer.Option(
        "--label", help="KEY=VALUE, repeatable", show_default=False, rich_help_panel=JOB_PANEL
    ),
]
WorkdirOption = Annotated[
    str | None,
    typer.Option(
        "--workdir", help="Working directory (default: current)", rich_help_panel=JOB_PANEL
    ),
]

OnlyNodesOption = Annotated[
    str | None, typer.Option("--only-nodes", help=ONLY_NODES_HELP, rich_help_panel=JOB_PANEL)
]
ExcludeNodesOption = Annotated[
    str | None, typer.Option("--exclude", "-x", help=EXCLUDE_HELP, rich_help_panel=JOB_PANEL)
]
NotifyOption = Annotated[
    str | None,
    typer.Option(
        "--notify",
        help="POST a JSON message (its text suits chat webhooks) to this URL when the job "
        "ends, as sbatch --mail-type; the server must allow the host",
        rich_help_panel=JOB_PANEL,
    ),
]
NotifyOnOption = Annotated[
    str | None,
    typer.Option(
        "--notify-on",
        help="start, end (the default), fail, requeue; comma-separated. Without --notify, "
        "to your default URL (gpusched me --notify URL)",
        rich_help_panel=JOB_PANEL,
    ),
]


def notify_events(text: str) -> list[str]:
    """`--notify-on start,fail` as the API's list (the server names a wrong one)."""
    return [event.strip() for event in text.split(",") if event.strip()]


# Selecting jobs by label (`gpusched jobs`, `cancel`), as the API's ?label=k=v.
LabelFilterOption = Annotated[
    list[str] | None,
    typer.Option("--label", help="KEY=VALUE, repeatable (all must match)", show_default=False),
]


# The tasks of one job array (`gpusched jobs`, `cancel`), as the API's ?array=ID.
ArrayFilterOption = Annotated[
    int | None,
    typer.Option("--array", help="The tasks of job array ID", show_default=False),
]


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
        spec["dependency"], spec["depends_on"] = _parse_dependency(dependency)
    if array is not None:
        spec["array"] = _array_spec(array)
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    client = ApiClient.from_options(url, token)
    response = client.request("POST", JOBS, json=spec, headers=headers)
    job = client.body(response)
    task_ids = [job["id"]]
    if job.get("array"):
        tasks, _ = _fetch_jobs(
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
        raise typer.Exit(_wait_for(client, task_ids, as_json=as_json, quiet=parsable))
    if as_json:
        print_json(job)
        return
    typer.echo(line)


DEPENDENCY_KINDS: tuple[str, ...] = get_args(DependencyKind)
# What `gpusched show` says a job's dependencies must do.
MUST = {
    "afterok": "must succeed",
    "afterany": "must end",
    "afternotok": "must fail",
    "after": "must start",
}


def _parse_dependency(text: str) -> tuple[str, list[int]]:
    """--dependency afterany:12:13 as ("afterany", [12, 13]), as sbatch writes it;
    --dependency singleton as ("singleton", [])."""
    kind, _, ids = text.partition(":")
    if kind not in DEPENDENCY_KINDS:
        raise CliError(
            f"--dependency: {kind!r} is not one of {', '.join(DEPENDENCY_KINDS)}", EXIT_USAGE
        )
    if kind == SINGLETON:
        if ids:
            raise CliError("--dependency: singleton names no jobs", EXIT_USAGE)
        return kind, []
    parts = ids.split(":")
    if not all(part.isdigit() for part in parts):
        raise CliError(f"--dependency: expected {kind}:ID[:ID...], got {text!r}", EXIT_USAGE)
    return kind, [int(part) for part in parts]


def _array_spec(text: str) -> dict[str, Any]:
    """--array 0-49%4 as the API's {"indices": "0-49", "max_running": 4}."""
    try:
        indices, max_running = split_slurm_form(text)
        parse_indices(indices)
    except ValueError as exc:
        raise CliError(f"--array: {exc}", EXIT_USAGE) from None
    return {"indices": indices, "max_running": max_running}


def _submitted_line(job: dict[str, Any], *, replay: bool, task_ids: list[int]) -> str:
    verb = "already submitted" if replay else "submitted"
    array = job.get("array")
    if array:
        limit = f", at most {array['max_running']} at once" if array["max_running"] else ""
        return (
            f"{verb} array {array['id']} ({escape_controls(job['name'])}): {array['tasks']} tasks, "
            f"jobs {_id_ranges(task_ids)}{limit} (gpusched jobs/cancel --array {array['id']})"
        )
    line = f"{verb} job {job['id']} ({_name_cell(job)}): {job['status']}"
    if job.get("pending_message"):
        line += f" — {escape_controls(job['pending_message'])}"
    if job.get("script_bytes") is not None:
        line += f"\n(it runs {job['command'][0]} as it is now: editing the file changes no job)"
    return line


def _id_ranges(ids: list[int]) -> str:
    """[12, 13, 14, 20] -> "12-14,20": an array's job ids are mostly consecutive."""
    runs: list[list[int]] = []
    for job_id in ids:
        if runs and job_id == runs[-1][-1] + 1:
            runs[-1].append(job_id)
        else:
            runs.append([job_id])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


ENDED = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"})
# Seconds between polls while waiting: a short job is seen ending soon, a long one costs
# a request every 15 s.
WAIT_POLLS_S = (1.0, 2.0, 5.0, 10.0, 15.0)
EXIT_INTERRUPTED = 130  # as a shell reports Ctrl-C


def _pause(seconds: float) -> None:
    time.sleep(seconds)


def _wait_for(client: ApiClient, job_ids: list[int], *, as_json: bool, quiet: bool = False) -> int:
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


def _gpus_cell(job: dict[str, Any]) -> str:
    share = job.get("gpu_share")
    per_node = f"{share:g}" if share is not None and share < 1 else str(job["gpus"])
    return per_node if job.get("nodes", 1) == 1 else f"{per_node}x{job['nodes']}"


def _name_cell(job: dict[str, Any]) -> str:
    """An array task shows its index, as Slurm's 12_3: the tasks share one name. A control
    character in it is written out (`\x1b`), not sent to the terminal."""
    array = job.get("array")
    name = escape_controls(str(job["name"]))
    return f"{name}[{array['index']}]" if array else name


def _reason_cell(job: dict[str, Any]) -> str:
    if job["status"] == "PENDING":  # it may name other jobs, by their names
        return escape_controls(str(job.get("pending_message") or job.get("pending_reason") or ""))
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
            _name_cell(job),
            str(job["project"]),
            str(job["user"]),
            str(job["status"]),
            _gpus_cell(job),
            _reason_cell(job),
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
            _name_cell(job),
            str(job["project"]),
            str(job["user"]),
            _gpus_cell(job),
            _start_cell(job.get("estimated_start_at"), now=now),
            _reason_cell(job),
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
    items, next_cursor = _fetch_jobs(client, params, cursor=cursor, all_pages=all_pages)
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


def _fetch_jobs(
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
        mode += f" {schedule.get('at')}"
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
        rows.append(("pending message", job.get("pending_message") or ""))
    if job.get("queue_position") is not None:
        rows.append(("queue position", job["queue_position"]))
    if rank is not None:  # as sprio: why the jobs ahead go first, at the last full cycle
        rows.append(("queue rank", f"{rank['message']} (policy {rank['policy']})"))
    if job.get("estimated_start_at"):
        rows.append(("estimated start", job["estimated_start_at"]))
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
            rows.append((key.removesuffix("_at"), job[key]))
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
                e["at"],
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
            when = n["sent_at"] or n["next_at"] or ""
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


JobIds = Annotated[list[int], typer.Argument(help="Job ids", show_default=False)]


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


OptionalJobIds = Annotated[
    list[int] | None, typer.Argument(help="Job ids (or select them with the options)")
]
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
    grace_s = _duration_option(grace, "--grace")
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
    line = f"{done} {count} job{'s' if count != 1 else ''}: {_id_ranges(answer['ids'])}"
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
        changes["max_runtime_s"] = None if cleared else _time_limit(max_runtime, time_limit)
    for field, value, option in (
        ("max_runtime_s", max_runtime, "--max-runtime"),
        ("estimated_runtime_s", estimated_runtime, "--estimated-runtime"),
        ("grace_s", grace, "--grace"),
    ):
        if value is not None:  # "none" clears it
            cleared = value.strip().lower() == "none"
            changes[field] = None if cleared else parse_duration(value, option)
    if gpu_memory_mb is not None:  # "none": any GPU with room, as when submitted without
        changes["gpu_memory_mb"] = _number_or_none(gpu_memory_mb, "--gpu-memory-mb")
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
            else _parse_dependency(dependency)
        )
        changes |= {"dependency": kind, "depends_on": ids}
    limit = _number_or_none(array_limit, "--array-limit") if array_limit is not None else None
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
    line = f"updated job {job['id']} ({_name_cell(job)}): {job['status']}"
    if job.get("pending_message"):
        line += f" — {escape_controls(job['pending_message'])}"
    return line


def _number_or_none(text: str, option: str) -> int | None:
    """A positive number, or None for "none" (which clears the setting)."""
    if text.strip().lower() == "none":
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise CliError(f"{option}: expected a positive number or none, got {text!r}", EXIT_USAGE)
    return int(text)


def _ended_line(job: dict[str, Any]) -> str:
    reason = _reason_cell(job)
    return f"job {job['id']} ({_name_cell(job)}): {job['status']}" + (
        f" ({reason})" if reason else ""
    )


def wait_jobs(
    job_ids: JobIds, as_json: JsonOption = False, url: UrlOption = None, token: TokenOption = None
) -> None:
    """Wait until jobs end, like sbatch --wait: exit 0 when all succeeded, else the exit
    code of the first that did not (1 if it has none). Ctrl-C stops waiting, not the jobs."""
    raise typer.Exit(_wait_for(ApiClient.from_options(url, token), job_ids, as_json=as_json))


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
    return f"job {job['id']} ({_name_cell(job)}): stopping, then back {back}"


def _hold_line(job: dict[str, Any]) -> str:
    state = f"held by {escape_controls(job['held_by'])}" if job.get("held_by") else job["status"]
    return f"job {job['id']} ({_name_cell(job)}): {state}"


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
        return f"job {job['id']} ({_name_cell(job)}): CANCELLED"
    if job.get("cancel_requested"):
        return f"job {job['id']} ({_name_cell(job)}): cancel requested, still {job['status']}"
    return f"job {job['id']} ({_name_cell(job)}): {job['status']}"


def register(app: typer.Typer) -> None:
    # Options after the first positional belong to the job's command: `submit -- python x.py
    # --lr 1` and `submit python x.py --lr 1` both keep `--lr 1` for the job.
    app.command(
        "submit",
        cls=ScriptCommand,
        context_settings={"allow_interspersed_args": False},
        rich_help_panel="Jobs",
    )(submit)
    app.command("jobs", rich_help_panel="Jobs")(list_jobs)
    app.command("queue", rich_help_panel="Jobs")(pending_queue)
    app.command("show", rich_help_panel="Jobs")(show)
    app.command("cancel", rich_help_panel="Jobs")(cancel)
    app.command("update", rich_help_panel="Jobs")(update)
    app.command("wait", rich_help_panel="Jobs")(wait_jobs)
    app.command("hold", rich_help_panel="Jobs")(hold)
    app.command("release", rich_help_panel="Jobs")(release)
    app.command("requeue", rich_help_panel="Jobs")(requeue)
