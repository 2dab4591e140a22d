"""`gpusched scheduler` and `gpusched agent`: the two kinds of Celery worker."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated

import typer
from pydantic import ValidationError

from app.cli.client import EXIT_USAGE, CliError
from app.cli.process_setup import ensure_data_dir, load_settings_or_exit, private_files
from app.config import Settings


def _with_redis(settings: Settings) -> Settings:
    if not settings.redis_url:
        raise CliError(
            "GPUSCHED_REDIS_URL is not set: workers need the Redis that the API uses "
            "(`gpusched up` starts a private one and sets it)",
            EXIT_USAGE,
        )
    return settings


class Work(StrEnum):
    all = "all"
    cycle = "cycle"
    reports = "reports"


def scheduler(
    beat: Annotated[bool, typer.Option(help="Run Celery beat in this process too")] = True,
    only: Annotated[
        Work,
        typer.Option(
            help="all: everything in this process; cycle: scheduling cycles, reconciliation "
            "and batches (with beat); reports: agents' heartbeats and job starts and ends "
            "(no beat). Run one process of each to use two cores"
        ),
    ] = Work.all,
) -> None:
    """Run the scheduling cycle, agents' reports and reconciliation (a Celery worker)."""
    from app.cycle.settings import SchedulerSettings
    from workers.scheduler_worker import run_scheduler_worker

    settings = _with_redis(load_settings_or_exit())
    private_files()
    ensure_data_dir(settings.data_dir)
    try:
        scheduler_settings = SchedulerSettings()
    except ValidationError as exc:
        raise CliError(f"unusable GPUSCHED_SCHEDULER_* setting: {exc}", EXIT_USAGE) from None
    run_scheduler_worker(settings, scheduler_settings, beat=beat, work=only.value)


def agent(
    name: Annotated[str | None, typer.Option(help="Node name (default: hostname)")] = None,
    gpus: Annotated[
        str | None, typer.Option(help="auto, nvml, or sim:COUNT:MODEL (e.g. sim:8:H100-80GB)")
    ] = None,
    label: Annotated[list[str], typer.Option(help="key=value, repeatable")] = [],  # noqa: B006
) -> None:
    """Run a node agent: report GPU telemetry and run the jobs placed on this node."""
    from app.logs import configure_logging
    from workers.agent.service import AgentSettings
    from workers.agent.worker import run_agent_worker

    settings = _with_redis(load_settings_or_exit())
    private_files()
    overrides: dict[str, object] = {}
    if name:
        overrides["name"] = name
    if gpus:
        overrides["gpus"] = gpus
    if label:
        pairs = [item.partition("=") for item in label]
        if any(not sep or not key for key, sep, _ in pairs):
            raise CliError("--label needs key=value", EXIT_USAGE)
        overrides["labels"] = {key: value for key, _, value in pairs}
    try:
        agent_settings = AgentSettings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise CliError(
            f"unusable agent setting: {json.dumps(exc.errors(), default=str)}", EXIT_USAGE
        ) from None
    configure_logging()
    from workers.agent.service import AgentCannotStart

    try:
        run_agent_worker(settings, agent_settings)
    except ValueError as exc:  # e.g. a malformed --gpus spec, an unusable node key file
        raise CliError(str(exc), EXIT_USAGE) from None
    except AgentCannotStart as exc:
        raise CliError(f"the agent cannot start: {exc}", EXIT_USAGE) from None


def register(app: typer.Typer) -> None:
    app.command("scheduler", rich_help_panel="Service")(scheduler)
    app.command("agent", rich_help_panel="Service")(agent)
