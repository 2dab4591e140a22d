"""Job commands: submit, jobs, queue, show, update, wait, cancel, hold, release, requeue.

options.py: the options and parsers they share; submit.py: submit and wait; views.py:
jobs, queue and show; control.py: cancel, hold, release, requeue and update."""

from __future__ import annotations

import typer

from app.cli.jobs import control, submit, views
from app.cli.sbatch import ScriptCommand


def register(app: typer.Typer) -> None:
    # Options after the first positional belong to the job's command: `submit -- python x.py
    # --lr 1` and `submit python x.py --lr 1` both keep `--lr 1` for the job.
    app.command(
        "submit",
        cls=ScriptCommand,
        context_settings={"allow_interspersed_args": False},
        rich_help_panel="Jobs",
    )(submit.submit)
    app.command("jobs", rich_help_panel="Jobs")(views.list_jobs)
    app.command("queue", rich_help_panel="Jobs")(views.pending_queue)
    app.command("show", rich_help_panel="Jobs")(views.show)
    app.command("cancel", rich_help_panel="Jobs")(control.cancel)
    app.command("update", rich_help_panel="Jobs")(control.update)
    app.command("wait", rich_help_panel="Jobs")(submit.wait_jobs)
    app.command("hold", rich_help_panel="Jobs")(control.hold)
    app.command("release", rich_help_panel="Jobs")(control.release)
    app.command("requeue", rich_help_panel="Jobs")(control.requeue)
