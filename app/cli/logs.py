"""`gpusched logs ID [-f] [--tail N] [--attempt K]`."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import httpx
import typer

from app.cli.client import OUTAGE_RIDE_OUT_S, ApiClient, TokenOption, Unreachable, UrlOption

START_POLL_S = 2.0  # how often `logs -f` asks whether a pending job has started
RECONNECT_S = 2.0  # how often `logs -f` tries an API that stopped answering mid-stream


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
    node_rank: Annotated[
        int,
        typer.Option("--node-rank", help="Which node of a multi-node job (0: the first)", min=0),
    ] = 0,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Print a job's output (stdout and stderr of its latest attempt; of a multi-node job,
    each node's apart: --node-rank)."""
    client = ApiClient.from_options(url, token)
    if not _started(client, job_id, wait=follow):
        return
    params: dict[str, object] = {"follow": follow}
    if tail is not None:
        params["tail"] = tail
    if attempt is not None:
        params["attempt"] = attempt
    if node_rank:
        params["node_rank"] = node_rank
    path = f"/api/v1/jobs/{job_id}/logs"
    if follow:
        _follow(client, path, params)
    else:
        answer = client.request("GET", path, params=params)
        sys.stdout.write(answer.text)
        nodes = int(answer.headers.get("X-Nodes", "1"))
        if nodes > 1:  # on stderr: the output stays the job's own
            typer.echo(f"(node {node_rank} of {nodes}; --node-rank N for another)", err=True)


def _follow(client: ApiClient, path: str, params: dict[str, object]) -> None:
    """Print the stream as it comes. If the API stops answering mid-stream (a restart of
    `gpusched up`), reconnect for up to OUTAGE_RIDE_OUT_S and go on from the byte reached,
    so nothing is printed twice or lost; the job runs on regardless."""
    reached: int | None = None  # byte of the log printed up to; None: never connected
    down_s = 0.0

    def started(headers: httpx.Headers) -> None:
        nonlocal reached
        reached = int(headers.get("X-Log-Offset", "0"))

    while True:
        try:
            for chunk in client.stream_bytes(path, params=params, on_start=started):
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
                reached = (reached or 0) + len(chunk)
                down_s = 0.0
            return  # the attempt ended: the server closed the stream
        except Unreachable as exc:
            if reached is None or down_s >= OUTAGE_RIDE_OUT_S:
                raise
            if not down_s:
                typer.echo(f"\n{exc.message}; reconnecting", err=True)
            _pause(RECONNECT_S)
            down_s += RECONNECT_S
            params = {k: v for k, v in params.items() if k != "tail"} | {"offset": reached}


def _pause(seconds: float) -> None:
    time.sleep(seconds)


def register(app: typer.Typer) -> None:
    app.command("logs", rich_help_panel="Jobs")(logs)
