"""`gpusched logs ID [-f] [--tail N] [--attempt K] [--node-rank R | --label]`."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any

import httpx
import typer

from app.cli.client import (
    EXIT_USAGE,
    OUTAGE_RIDE_OUT_S,
    ApiClient,
    CliError,
    TokenOption,
    Unreachable,
    UrlOption,
)
from app.cli.jobs.views import pending_text

START_POLL_S = 2.0  # how often `logs -f` asks whether a pending job has started
RECONNECT_S = 2.0  # how often `logs -f` tries an API that stopped answering mid-stream


def _started(client: ApiClient, job_id: int, *, wait: bool) -> dict[str, Any] | None:
    """The job once it has run, so that it has output. If it has not, say why on stderr (an
    empty answer would look like a job that printed nothing) and return None; with
    --follow, wait for the start, as `tail -F` on a Slurm output file that does not exist
    yet does."""
    announced = False
    while True:
        job: dict[str, Any] = client.body(client.request("GET", f"/api/v1/jobs/{job_id}"))
        if job["attempt"] > 0:
            return job
        why = (
            f"{job['status']}: {pending_text(job)}" if job.get("pending_message") else job["status"]
        )
        if job["status"] != "PENDING":
            typer.echo(f"job {job_id} never started ({why}); no output", err=True)
            return None
        if not wait:
            typer.echo(f"job {job_id} has not started yet ({why}); no output", err=True)
            return None
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
    label: Annotated[
        bool,
        typer.Option(
            "--label",
            "-l",
            help="Every node's output, each line prefixed with its node rank ('1: '), as "
            "srun --label; with -f as the lines come",
        ),
    ] = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Print a job's output (stdout and stderr of its latest attempt; of a multi-node job,
    each node's apart: --node-rank, or all of them with --label)."""
    if label and node_rank:
        raise CliError("--label prints every node's output: leave out --node-rank", EXIT_USAGE)
    client = ApiClient.from_options(url, token)
    job = _started(client, job_id, wait=follow)
    if job is None:
        return
    params: dict[str, object] = {"follow": follow}
    if tail is not None:
        params["tail"] = tail
    if attempt is not None:
        params["attempt"] = attempt
    if node_rank:
        params["node_rank"] = node_rank
    path = f"/api/v1/jobs/{job_id}/logs"
    if label:
        _labelled(client, path, params, nodes=job["nodes"])
    elif follow:
        _follow(client, path, params)
    else:
        answer = client.request("GET", path, params=params)
        sys.stdout.write(answer.text)
        nodes = int(answer.headers.get("X-Nodes", "1"))
        if nodes > 1:  # on stderr: the output stays the job's own
            typer.echo(
                f"(node {node_rank} of {nodes}; --node-rank N for another, --label for all)",
                err=True,
            )


class _Labeller:
    """Writes one node's bytes as whole lines, each prefixed with its rank; lines of
    several nodes never mix (one lock for all)."""

    def __init__(self, rank: int, lock: threading.Lock) -> None:
        self.prefix = f"{rank}: ".encode()
        self.lock = lock
        self.partial = b""

    def write(self, chunk: bytes) -> None:
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        if lines:
            self._emit(b"".join(self.prefix + line + b"\n" for line in lines))

    def close(self) -> None:
        if self.partial:  # a last line without its newline
            self._emit(self.prefix + self.partial + b"\n")
            self.partial = b""

    def _emit(self, data: bytes) -> None:
        with self.lock:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()


def _labelled(client: ApiClient, path: str, params: dict[str, object], *, nodes: int) -> None:
    """Every node's log, labelled by rank: one after the other, or with follow all at
    once, each in its own thread (their lines interleave as they come)."""
    lock = threading.Lock()
    if not params["follow"]:
        for rank in range(nodes):
            labeller = _Labeller(rank, lock)
            labeller.write(client.request("GET", path, params=params | {"node_rank": rank}).content)
            labeller.close()
        return
    failures: list[BaseException] = []

    def follow_one(rank: int) -> None:
        labeller = _Labeller(rank, lock)
        try:
            _follow(client, path, params | {"node_rank": rank}, write=labeller.write)
        except BaseException as exc:  # re-raised below, in the main thread
            failures.append(exc)
        finally:
            labeller.close()

    threads = [threading.Thread(target=follow_one, args=(rank,)) for rank in range(nodes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]


def _write_stdout(chunk: bytes) -> None:
    sys.stdout.buffer.write(chunk)
    sys.stdout.flush()


def _follow(
    client: ApiClient,
    path: str,
    params: dict[str, object],
    *,
    write: Callable[[bytes], None] = _write_stdout,
) -> None:
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
                write(chunk)
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
