"""What `gpusched submit` does as sbatch does: a job script's #SBATCH and #GPUSCHED lines
are options, its text at submission is what runs, a script named without a path is the one
in the working directory, and --export sends the submitter's environment along.

A Slurm user's job script carries its options in `#SBATCH` lines before its first command;
moved here, silently ignoring them would run a job asking for 4 GPUs on 1. The options of
`#GPUSCHED` lines are `submit`'s own; those of `#SBATCH` lines are Slurm's, translated where
they mean the same here, refused where the nearest option would mean something else, and
named on stderr where there is nothing to translate them to. Options given on the command
line win over the script's, as with sbatch.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperCommand

from app.cli.client import EXIT_USAGE, CliError
from app.jobs.spec_limits import ENV_NAME, MAX_SCRIPT_CHARS, RESERVED_ENV

# sbatch stops at the first line that is neither blank nor a comment; a script is read up
# to that line, and no further than this.
_MAX_HEADER_BYTES = 64 * 1024
_DIRECTIVE = re.compile(r"#(SBATCH|GPUSCHED)\s+(.*)")

# A script given on standard input (`gpusched submit < train.sh`): where parse_args keeps
# it for the command, and the name it runs under.
STDIN_SCRIPT = "gpusched.stdin_script"
STDIN_NAME = "script"

# sbatch's one-letter options, by their long names (the tables below use only those).
_LONG = {
    "-A": "--account",
    "-C": "--constraint",
    "-D": "--chdir",
    "-G": "--gpus",
    "-H": "--hold",
    "-J": "--job-name",
    "-N": "--nodes",
    "-O": "--overcommit",
    "-Q": "--quiet",
    "-W": "--wait",
    "-a": "--array",
    "-c": "--cpus-per-task",
    "-d": "--dependency",
    "-e": "--error",
    "-k": "--no-kill",
    "-n": "--ntasks",
    "-o": "--output",
    "-p": "--partition",
    "-s": "--oversubscribe",
    "-t": "--time",
    "-v": "--verbose",
    "-w": "--nodelist",
    "-x": "--exclude",
}
# Slurm's options that are submit's own, with the same meaning.
_SAME = frozenset(
    {"--job-name", "--nodes", "--time", "--begin", "--array", "--dependency", "--hold"}
    | {"--exclude", "--priority", "--wait", "--export", "--parsable"}
)
_RENAMED = {"--gpus-per-node": "--gpus", "--account": "--project", "--chdir": "--workdir"}
# Slurm options that take no value (any other takes the next word when not written --x=v).
_SLURM_FLAGS = frozenset(
    {"--hold", "--wait", "--exclusive", "--requeue", "--no-requeue", "--parsable"}
    | {"--overcommit", "--contiguous", "--spread-job", "--test-only", "--use-min-nodes"}
    | {"--quiet", "--verbose", "--no-kill", "--oversubscribe"}
)
_LOGS = "the job's output is kept by gpusched: gpusched logs ID"
_WEBHOOKS = "notifications are webhooks: #GPUSCHED --notify URL --notify-on end,fail"
_HOST = "gpusched places GPUs, not host memory or CPUs"
_TASKS = "one process starts per node; torchrun starts one per GPU from the WORLD_SIZE, RANK and MASTER_ADDR set for it"
_REQUEUE = "a job that is preempted or loses its node is always requeued"
# Slurm options this service has no counterpart for, and what to do instead.
_NO_COUNTERPART = {
    "--output": _LOGS,
    "--error": _LOGS,
    "--mail-type": _WEBHOOKS,
    "--mail-user": _WEBHOOKS,
    "--mem": _HOST,
    "--mem-per-gpu": f"{_HOST} (GPU memory: --gpu-memory-mb)",
    "--cpus-per-task": _HOST,
    "--partition": "a gpusched cluster has one partition",
    "--qos": "a job's standing is its --priority and its project's fair share",
    "--constraint": "the GPU model is --gres=gpu:MODEL:N (#GPUSCHED --gpu-model)",
    "--ntasks": _TASKS,
    "--ntasks-per-node": _TASKS,
    "--signal": "a job stopped or at its time limit gets SIGTERM, then its grace period "
    "to checkpoint (#GPUSCHED --grace 5m)",
    "--requeue": _REQUEUE,
    "--no-requeue": _REQUEUE,
    "--exclusive": "a job's GPUs are its own; whole nodes are kept for jobs that need them",
}
# Slurm options whose nearest counterpart here would do something else: refused.
_REFUSED = {
    "--nodelist": "it asks for all of these nodes; #GPUSCHED --only-nodes A,B runs on any of them",
}


@dataclass(frozen=True, slots=True)
class Directive:
    where: str  # "train.sh:3", for messages
    kind: str  # SBATCH or GPUSCHED
    words: list[str]


def read_directives(script: Path) -> list[Directive]:
    """The #SBATCH/#GPUSCHED lines of a script file before its first command."""
    try:
        with script.open("rb") as f:
            head = f.read(_MAX_HEADER_BYTES)
    except OSError:
        return []
    return directives_of(script.name, head)


def directives_of(name: str, head: bytes) -> list[Directive]:
    """The #SBATCH/#GPUSCHED lines of a script (one starting with #!) before its first command."""
    if not head.startswith(b"#!"):
        return []  # a program, not a script
    found = []
    for number, raw in enumerate(head.decode("utf-8", "replace").splitlines(), start=1):
        line = raw.strip()
        if line and not line.startswith("#"):
            break
        match = _DIRECTIVE.fullmatch(line)
        if match is None:
            continue
        where = f"{name}:{number}"
        try:
            words = shlex.split(match[2], comments=True)
        except ValueError as exc:
            raise CliError(f"{where}: {line}: {exc}", EXIT_USAGE) from None
        found.append(Directive(where, match[1], words))
    return found


def _slurm_words(words: Sequence[str]) -> list[tuple[str, str, str | None]]:
    """(as written, long name, value) of each option of one #SBATCH line: --x=v, --x v,
    -x v and -xv."""
    found: list[tuple[str, str, str | None]] = []
    rest = list(words)
    while rest:
        word = rest.pop(0)
        if not word.startswith("-") or word == "-":
            raise ValueError(f"{word!r} is not an option")
        written, eq, attached = (
            word.partition("=") if word.startswith("--") else (word[:2], "", word[2:])
        )
        long = _LONG.get(written, written)
        if eq or attached:
            found.append((written, long, attached))
        else:
            found.append((written, long, None if long in _SLURM_FLAGS or not rest else rest.pop(0)))
    return found


def _gres_gpus(value: str) -> tuple[int, str | None]:
    """GPUs per node and model of `--gres=gpu:2`, `gpu:h100:2` or `gpu` (one)."""
    for item in value.split(","):
        parts = item.split(":")
        if parts[0] != "gpu" or len(parts) > 3:
            continue
        count = parts[-1] if len(parts) > 1 and parts[-1].isdigit() else "1"
        model = (
            parts[1] if len(parts) == 3 or (len(parts) == 2 and not parts[1].isdigit()) else None
        )
        return int(count), model
    raise ValueError("no gpu in it (write gpu:N or gpu:MODEL:N)")


@dataclass
class ScriptOptions:
    """submit's options from a script's lines (where, words), and Slurm's per-job --gpus."""

    lines: list[tuple[str, list[str]]]
    notes: list[str]
    slurm_total_gpus: tuple[str, int] | None = None  # (where, N) of #SBATCH --gpus=N
    script_nodes: int | None = None
    sbatch_lines: int = 0

    @property
    def words(self) -> list[str]:
        return [word for _, words in self.lines for word in words]


def translate(directives: list[Directive]) -> ScriptOptions:
    out = ScriptOptions(lines=[], notes=[])
    for d in directives:
        if d.kind == "GPUSCHED":
            out.lines.append((d.where, d.words))
            continue
        out.sbatch_lines += 1
        try:
            pairs = _slurm_words(d.words)
        except ValueError as exc:
            raise CliError(f"{d.where}: #SBATCH {shlex.join(d.words)}: {exc}", EXIT_USAGE) from None
        words: list[str] = []
        for written, option, value in pairs:
            shown = f"{d.where}: #SBATCH {written}{'' if value is None else '=' + value}"
            ours = option if option in _SAME else _RENAMED.get(option)
            try:
                if ours is not None:
                    words += [ours] if value is None else [ours, value]
                    if option == "--nodes" and value is not None and value.isdigit():
                        out.script_nodes = int(value)
                elif option == "--gres":
                    count, model = _gres_gpus(value or "")
                    words += ["--gpus", str(count), *(["--gpu-model", model] if model else [])]
                elif option == "--gpus":
                    if value is None or not value.isdigit():
                        raise ValueError("expected a number of GPUs")
                    out.slurm_total_gpus = (shown, int(value))
                elif option in _REFUSED:
                    raise ValueError(_REFUSED[option])
                else:
                    why = _NO_COUNTERPART.get(option, "gpusched has no such option")
                    out.notes.append(f"{shown}: ignored: {why}")
            except ValueError as exc:
                raise CliError(f"{shown}: {exc}", EXIT_USAGE) from None
        out.lines.append((d.where, words))
    return out


def script_of(command: Sequence[str] | None, workdir: str | None) -> Path | None:
    """The local file a job's command starts (as its node will see it, from its working
    directory), unless its program is one found on PATH."""
    if not command or ("/" not in command[0] and shutil.which(command[0]) is not None):
        return None
    path = Path(workdir or os.getcwd(), command[0])
    return path if path.is_file() else None


def script_copy(command: Sequence[str], workdir: str) -> str | None:
    """The text of the script the command starts (a local file beginning with #!), to be
    run as it is now, as sbatch runs a copy of its script: edited or deleted while the job
    waits, the job still runs what was submitted. None for a program, or a script that
    cannot travel in a submission (then it runs from its file, and this says so)."""
    local = script_of(command, workdir)
    if local is None:
        return None
    try:
        with local.open("rb") as f:
            data = f.read(MAX_SCRIPT_CHARS + 1)  # bytes: never fewer than characters
    except OSError:
        return None
    if not data.startswith(b"#!"):
        return None
    try:
        if len(data) > MAX_SCRIPT_CHARS:
            raise ValueError(f"is over {MAX_SCRIPT_CHARS} bytes")
        return data.decode("utf-8")
    except ValueError as exc:  # UnicodeDecodeError is one
        why = "is not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc)
        typer.echo(
            f"note: {command[0]} {why}: the job runs the file as it is when it starts", err=True
        )
        return None


# What a Slurm script reads from its environment, and where the same is found here. Not set
# under Slurm's names: libraries that see SLURM_* believe srun started them (Lightning
# reads its ranks from SLURM_PROCID once SLURM_NTASKS is set).
_SLURM_VARIABLES = {
    "SLURM_JOB_ID": "$GPUSCHED_JOB_ID",
    "SLURM_ARRAY_TASK_ID": "$GPUSCHED_ARRAY_TASK_ID",
    "SLURM_ARRAY_JOB_ID": "$GPUSCHED_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_COUNT": "$GPUSCHED_ARRAY_TASK_COUNT",
    "SLURM_RESTART_COUNT": "$GPUSCHED_ATTEMPT (1 on the first run)",
    "SLURM_SUBMIT_DIR": "the job's working directory, where it starts",
    "SLURM_NODEID": "$NODE_RANK",
    "SLURM_PROCID": "$RANK",
    "SLURM_NNODES": "$PET_NNODES",
    "SLURM_JOB_NUM_NODES": "$PET_NNODES",
    "SLURM_JOB_NODELIST": "$MASTER_ADDR (the first node)",
    "SLURM_NODELIST": "$MASTER_ADDR (the first node)",
}
_SLURM_VARIABLE = re.compile(r"\bSLURM_[A-Z_]+\b")


# Slurm's commands a script may run, which a gpusched node does not have.
_SLURM_COMMANDS = {
    "srun": "run the program itself: one process starts per node, and torchrun starts one per GPU",
    "scontrol": "the first node is $MASTER_ADDR; gpusched show $GPUSCHED_JOB_ID tells the rest",
    "sbatch": "gpusched submit",
    "squeue": "gpusched queue",
    "sacct": "gpusched jobs",
    "scancel": "gpusched cancel",
}
# A command word: at a line's start, or after ; & | ( ` $( or exec/time.
_SLURM_COMMAND = re.compile(
    r"(?:^|[;&|(`]|\bexec|\btime)\s*(" + "|".join(_SLURM_COMMANDS) + r")\b", re.MULTILINE
)


def note_slurm_use(name: str, text: str) -> None:
    """A Slurm script reading $SLURM_ARRAY_TASK_ID would get nothing here, and one running
    `srun python train.py` would fail on `srun`: say so at submission, with where the same
    is found, instead of letting every task run as task '' or fail on its node."""
    used = sorted(set(_SLURM_VARIABLE.findall(text)))
    if used:
        found = [f"${v} ({_SLURM_VARIABLES.get(v, 'no counterpart')})" for v in used]
        typer.echo(
            f"note: {name} reads Slurm's variables, unset here: {', '.join(found)}", err=True
        )
    for command in sorted(set(_SLURM_COMMAND.findall(text))):
        typer.echo(
            f"note: {name} runs {command}, which gpusched's nodes do not have: "
            f"{_SLURM_COMMANDS[command]}",
            err=True,
        )


def stdin_script_text(data: bytes | None) -> str | None:
    """The script read from standard input, which must be one (start with #!), as sbatch
    requires, and fit a submission; what it uses of Slurm's is named, as for a file."""
    if data is None:
        return None
    if not data.startswith(b"#!"):
        raise CliError(
            "standard input is not a script: its first line must start with #! and the "
            "interpreter (#!/bin/bash), as for sbatch",
            EXIT_USAGE,
        )
    if len(data) > MAX_SCRIPT_CHARS:
        raise CliError(f"the script on standard input is over {MAX_SCRIPT_CHARS} bytes", EXIT_USAGE)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CliError("the script on standard input is not UTF-8 text", EXIT_USAGE) from None
    note_slurm_use(STDIN_NAME, text)
    return text


def job_command(
    command: Sequence[str], workdir: str, *, copy: bool
) -> tuple[list[str], str | None]:
    """The command as its node can start it, and the script's text to run when `copy`
    (submit, as sbatch) and the command starts a script; a cron batch (no copy) runs the
    file as it is at each firing."""
    script = script_copy(command, workdir) if copy else None
    if script is not None:
        note_slurm_use(command[0], script)
    elif not copy:
        note_unread_directives(command, workdir)
    return runnable(list(command), workdir, copied=script is not None), script


def note_unread_directives(command: Sequence[str], workdir: str) -> None:
    """A cron batch's options are fixed when it is created and its script runs as it is at
    each firing: its #SBATCH lines are not read; say so rather than ignore them silently."""
    local = script_of(command, workdir)
    with contextlib.suppress(CliError):  # a malformed line is not read either
        if local is None or not read_directives(local):
            return
    typer.echo(
        f"note: {command[0]}: #SBATCH and #GPUSCHED lines are not read for a cron batch; "
        "give their options to batch create",
        err=True,
    )


def runnable(command: list[str], workdir: str, *, copied: bool = False) -> list[str]:
    """The command as the job's node can start it: a script named without a path, as for
    sbatch, is the one in the working directory (not on PATH); one that cannot be executed
    (and is not run from a copy) is refused now rather than failing on its node."""
    program = command[0]
    local = script_of(command, workdir)
    if local is None:
        return command
    if not copied and not os.access(local, os.X_OK):
        raise CliError(
            f"{program} is not executable: chmod +x {program}, or submit -- sh {program}",
            EXIT_USAGE,
        )
    return command if "/" in program else [f"./{program}", *command[1:]]


class ScriptCommand(TyperCommand):
    """`submit`, reading the options of the script it is given before its own."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:  # type: ignore[override]
        given = self._probe(ctx, args, resilient=True)
        if "--help" in args:
            return super().parse_args(ctx, args)
        script = script_of(given.get("command"), given.get("workdir"))
        name, directives = "", []
        if script is not None:
            name, directives = script.name, read_directives(script)
        elif not given.get("command") and not given.get("shell") and not sys.stdin.isatty():
            # No program: the script comes on standard input, as for sbatch.
            text = sys.stdin.buffer.read(MAX_SCRIPT_CHARS + 1)
            if text:
                ctx.meta[STDIN_SCRIPT] = text
                name, directives = STDIN_NAME, directives_of(STDIN_NAME, text)
        if name:
            options = translate(directives)
            for where, words in options.lines:
                self._check(ctx, words, where)
            nodes = given.get("nodes") or options.script_nodes or 1
            if options.slurm_total_gpus is not None:
                shown, total = options.slurm_total_gpus
                if total % nodes:
                    raise CliError(
                        f"{shown}: Slurm counts --gpus for the whole job; {total} GPUs do not "
                        f"split evenly over {nodes} nodes (write --gpus-per-node)",
                        EXIT_USAGE,
                    )
                options.lines.append((shown, ["--gpus", str(total // nodes)]))
            if options.sbatch_lines and not given.get("export") and "--export" not in options.words:
                options.notes.append(
                    f"{name}: sbatch would start it with your environment "
                    "(--export=ALL); here it starts with a clean one, PATH from the node: "
                    "add --export ALL, or name what it needs (--export PATH,CONDA_PREFIX)"
                )
            for note in options.notes:
                typer.echo(f"note: {note}", err=True)
            args = [*options.words, *args]
        return super().parse_args(ctx, args)

    def _probe(self, ctx: typer.Context, args: Sequence[str], *, resilient: bool) -> dict[str, Any]:
        probe = typer.Context(
            self,
            info_name=ctx.info_name,
            parent=ctx.parent,
            resilient_parsing=resilient,
            **self.context_settings,
        )
        super().parse_args(probe, list(args))
        return probe.params

    def _check(self, ctx: typer.Context, words: list[str], where: str) -> None:
        """The script's options alone must parse, and be options only: a stray word would
        otherwise become part of the job's command."""
        try:
            params = self._probe(ctx, words, resilient=False)
        except typer.TyperException as exc:
            raise CliError(f"{where}: {exc.format_message()}", EXIT_USAGE) from None
        if params.get("command"):
            raise CliError(f"{where}: {' '.join(params['command'])!r} is not an option", EXIT_USAGE)


# Shell bookkeeping, meaningless in another process; gpusched's own settings (the API
# token among them) and what the agent sets for every job never travel with --export.
_NOT_EXPORTED = frozenset({"_", "SHLVL", "PWD", "OLDPWD"})
MAX_ENV_VARS = 256


def exported_env(text: str, environ: Mapping[str, str]) -> dict[str, str]:
    """sbatch --export: ALL (your environment), NONE, or NAME (its value here) and
    NAME=VALUE items, with ALL among them or not."""
    exported: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        name, sep, value = item.partition("=")
        if item.upper() == "ALL":
            exported.update(
                (k, v)
                for k, v in environ.items()
                if ENV_NAME.match(k) and not k.startswith(RESERVED_ENV) and k not in _NOT_EXPORTED
            )
        elif item.upper() == "NONE" or not item:
            continue
        elif sep:
            exported[name] = value
        elif name in environ:
            exported[name] = environ[name]
        else:
            raise CliError(f"--export: {name} is not set in your environment", EXIT_USAGE)
    if len(exported) > MAX_ENV_VARS:
        raise CliError(
            f"--export: {len(exported)} variables, more than the {MAX_ENV_VARS} a job may "
            "carry: name the ones it needs, e.g. --export PATH,CONDA_PREFIX",
            EXIT_USAGE,
        )
    return exported
