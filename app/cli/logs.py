"""`gpusched logs ID [-f] [--tail N] [--attempt K]`."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import typer

from app.cli.client import ApiClient, TokenOption, UrlOption

START_POLL_S = 2.0  # how often `logs -f` asks whether a pending job has started


def _started(client: ApiClient, job_id: int, *, wait: bool) -> bool:
    """Whether the job has run, so that it has output. If not, say why on stderr (an empty
    answer would look like a job that printed nothing); with --follow, wait for the start,
    as `tail -F` on a Slurm output file that does not exist yet does."""
    announced = False
    while True:
        job: dict[str, Any] = client.body(client.request("GET", f"/api/v1/jobs/{job_id}"))
        if job["attempt"] > 0:
            return True
        why = (
            f"{job['status']}: {job['pending_message']}"
            if job.get("pending_message")
            else job["status"]
        )
        if job["status"] != "PENDING":
            typer.echo(f"job {job_id} never started ({why}); no output", err=True)
            return False
        if not wait:
            typer.echo(f"job {job_id} has not started yet ({why}); no output", err=True)
            return False
        if not announced:
            typer.echo(f"job {job_id} has not started yet ({why}); waiting for it", err=True)
            announced = True
        time.sleep(START_POLL_S)


def logs(
    job_id: Annotated[int, typer.Argument(help="Job id", show_default=False)],
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Keep printing output until the attempt ends (waits for a pending job to start)",
        ),
    ] = False,
    tail: Annotated[int | None, typer.Option(help="Only the last N lines", min=1)] = None,
    attempt: Annotated[int | None, typer.Option(help="Attempt (default: latest)", min=1)] = None,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Print a job's output (stdout and stderr of its latest attempt)."""
    client = ApiClient.from_options(url, token)
    if not _started(client, job_id, wait=follow):
        return
    params: dict[str, object] = {"follow": follow}
    if tail is not None:
        params["tail"] = tail
    if attempt is not None:
        params["attempt"] = attempt
    path = f"/api/v1/jobs/{job_id}/logs"
    if follow:
        for chunk in client.stream_text(path, params=params):
            sys.stdout.write(chunk)
            sys.stdout.flush()
    else:
        sys.stdout.write(client.request("GET", path, params=params).text)


def register(app: typer.Typer) -> None:
    app.command("logs", rich_help_panel="Jobs")(logs)
