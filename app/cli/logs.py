"""`gpusched logs ID [-f] [--tail N] [--attempt K]`."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from app.cli.client import ApiClient, TokenOption, UrlOption


def logs(
    job_id: Annotated[int, typer.Argument(help="Job id", show_default=False)],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing output until the attempt ends")
    ] = False,
    tail: Annotated[int | None, typer.Option(help="Only the last N lines", min=1)] = None,
    attempt: Annotated[int | None, typer.Option(help="Attempt (default: latest)", min=1)] = None,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Print a job's output (stdout and stderr of its latest attempt)."""
    client = ApiClient.from_options(url, token)
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
