"""What the job commands share: their options (typer annotations), the parsers of durations,
Slurm time limits, pairs, node lists, dependencies and arrays, and build_spec, which
turns the options into the JSON a job is submitted or updated with."""

from __future__ import annotations

import os
import re
from typing import Annotated, Any, get_args

import typer

from app.cli.client import (
    EXIT_USAGE,
    CliError,
    parse_at,
)
from app.cli.sbatch import (
    STDIN_NAME,
    exported_env,
    job_command,
)
from app.jobs.arrays import parse_indices, split_slurm_form
from app.jobs.states import SINGLETON, DependencyKind

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


def runtime_limit_s(max_runtime: str | None, time_limit: str | None) -> int | None:
    """--max-runtime or its sbatch spelling --time, not both."""
    if max_runtime is not None and time_limit is not None:
        raise CliError("--max-runtime and --time are the same limit: give one", EXIT_USAGE)
    if time_limit is not None:
        return parse_slurm_time(time_limit)
    return duration_option(max_runtime, "--max-runtime")


def duration_option(value: str | None, what: str) -> int | None:
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
        "max_runtime_s": runtime_limit_s(max_runtime, time_limit),
        "estimated_runtime_s": duration_option(estimated_runtime, "--estimated-runtime"),
        "grace_s": duration_option(grace, "--grace"),
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


DEPENDENCY_KINDS: tuple[str, ...] = get_args(DependencyKind)


# What `gpusched show` says a job's dependencies must do.
MUST = {
    "afterok": "must succeed",
    "afterany": "must end",
    "afternotok": "must fail",
    "after": "must start",
}


def parse_dependency(text: str) -> tuple[str, list[int]]:
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


def array_spec(text: str) -> dict[str, Any]:
    """--array 0-49%4 as the API's {"indices": "0-49", "max_running": 4}."""
    try:
        indices, max_running = split_slurm_form(text)
        parse_indices(indices)
    except ValueError as exc:
        raise CliError(f"--array: {exc}", EXIT_USAGE) from None
    return {"indices": indices, "max_running": max_running}


JobIds = Annotated[list[int], typer.Argument(help="Job ids", show_default=False)]


OptionalJobIds = Annotated[
    list[int] | None, typer.Argument(help="Job ids (or select them with the options)")
]


def number_or_none(text: str, option: str) -> int | None:
    """A positive number, or None for "none" (which clears the setting)."""
    if text.strip().lower() == "none":
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise CliError(f"{option}: expected a positive number or none, got {text!r}", EXIT_USAGE)
    return int(text)
