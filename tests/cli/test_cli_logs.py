"""`gpusched logs` for jobs that have not run: say so, or with --follow wait for the start."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import Result

import app.cli.logs as logs_module
from app.cli.client import ApiClient, Unreachable
from app.jobs.models import Job
from app.jobs.states import JobStatus
from app.wire import attempt_log_path
from tests.cli.harness import Cli


def _submit(cli: Cli) -> int:
    result = cli("submit", "--json", "--name", "later", "--", "echo", "hello")
    assert result.exit_code == 0, result.stderr
    job_id: int = json.loads(result.stdout)["id"]
    return job_id


def _set(cli: Cli, job_id: int, **values: Any) -> None:
    with cli.factory.begin() as session:
        job = session.get_one(Job, job_id)
        for key, value in values.items():
            setattr(job, key, value)


def test_a_pending_or_never_started_job_says_why_it_has_no_output(cli: Cli) -> None:
    job_id = _submit(cli)
    result = cli("logs", str(job_id))
    assert result.exit_code == 0 and result.stdout == ""
    assert f"job {job_id} has not started yet (PENDING" in result.stderr

    assert cli("cancel", str(job_id)).exit_code == 0
    result = cli("logs", "--follow", str(job_id))  # nothing to wait for
    assert result.exit_code == 0 and result.stdout == ""
    assert f"job {job_id} never started (CANCELLED)" in result.stderr


def test_follow_waits_for_a_pending_job_to_start(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    # The CLI's pause between polls tells the test it is waiting, and waits for the start.
    waiting, started = threading.Event(), threading.Event()

    def pause(_seconds: float) -> None:
        waiting.set()
        started.wait(20)

    monkeypatch.setattr(logs_module, "time", SimpleNamespace(sleep=pause))
    job_id = _submit(cli)
    done: list[Result] = []
    follower = threading.Thread(target=lambda: done.append(cli("logs", "-f", str(job_id))))
    follower.start()
    assert waiting.wait(20)
    assert follower.is_alive()  # waiting, not returning an empty log

    # The job starts (as an agent would report) and prints, then ends.
    log = attempt_log_path(cli.settings.log_dir, job_id, 1)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("hello\n")
    _set(cli, job_id, attempt=1, status=JobStatus.RUNNING)
    started.set()
    _set(cli, job_id, status=JobStatus.SUCCEEDED)
    follower.join(timeout=20)

    assert not follower.is_alive()
    assert done[0].exit_code == 0, done[0].stderr
    assert done[0].stdout == "hello\n"
    assert f"job {job_id} has not started yet (PENDING" in done[0].stderr
    assert "waiting for it" in done[0].stderr


def test_follow_resumes_where_it_was_after_the_api_restarts(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection drops mid-line (a restart of `gpusched up`): the follower reconnects
    from the byte it reached, so nothing is printed twice or lost."""
    job_id = _submit(cli)
    log = attempt_log_path(cli.settings.log_dir, job_id, 1)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("one\ntwo\n")
    _set(cli, job_id, attempt=1, status=JobStatus.RUNNING)

    real_stream = ApiClient.stream_bytes
    calls: list[dict[str, Any]] = []

    def dropping(self: ApiClient, path: str, **kwargs: Any) -> Iterator[bytes]:
        calls.append(dict(kwargs["params"]))
        chunks = real_stream(self, path, **kwargs)
        if len(calls) > 1:
            yield from chunks
            return
        yield next(chunks)[:5]  # "one\nt", then the server is gone
        raise Unreachable("cannot reach gpusched at http://test: connection refused")

    def meanwhile(seconds: float) -> None:  # while the API restarts, the job prints and ends
        with log.open("a") as f:
            f.write("three\n")
        _set(cli, job_id, status=JobStatus.SUCCEEDED)

    monkeypatch.setattr(ApiClient, "stream_bytes", dropping)
    monkeypatch.setattr(logs_module, "_pause", meanwhile)
    result = cli("logs", "-f", "--tail", "5", str(job_id))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "one\ntwo\nthree\n"
    assert "connection refused; reconnecting" in result.stderr
    assert calls[1] == {"follow": True, "offset": 5}  # --tail applied once, at the start


def test_follow_does_not_retry_an_api_that_never_answered(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = _submit(cli)
    _set(cli, job_id, attempt=1, status=JobStatus.RUNNING)

    def refused(self: ApiClient, path: str, **kwargs: Any) -> Iterator[bytes]:
        raise Unreachable("cannot reach gpusched at http://test: connection refused")
        yield b""  # a generator, as the real one

    def never(seconds: float) -> None:
        raise AssertionError("retried an API that never answered the stream")

    monkeypatch.setattr(ApiClient, "stream_bytes", refused)
    monkeypatch.setattr(logs_module, "_pause", never)
    result = cli("logs", "-f", str(job_id))
    assert result.exit_code == 2 and "connection refused" in result.stderr


def test_each_node_of_a_multi_node_job_has_its_own_log(cli: Cli) -> None:
    job_id = _submit(cli)
    for rank in (0, 1):
        log = attempt_log_path(cli.settings.log_dir, job_id, 1, rank)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"node {rank}\n")
    _set(cli, job_id, attempt=1, nodes=2, status=JobStatus.SUCCEEDED)

    first = cli("logs", str(job_id))
    assert (first.stdout, first.stderr) == (
        "node 0\n",
        "(node 0 of 2; --node-rank N for another, --label for all)\n",
    )
    assert cli("logs", str(job_id), "--node-rank", "1").stdout == "node 1\n"
    beyond = cli("logs", str(job_id), "--node-rank", "2")
    assert beyond.exit_code == 1
    assert f"job {job_id} runs on 2 node(s): node_rank 0 to 1" in beyond.stderr


def test_label_prints_every_nodes_output_prefixed_with_its_rank(cli: Cli) -> None:
    job_id = _submit(cli)
    texts = {0: "step 1\nstep 2\n", 1: "ready\nno newline at the end"}
    for rank, text in texts.items():
        log = attempt_log_path(cli.settings.log_dir, job_id, 1, rank)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(text)
    _set(cli, job_id, attempt=1, nodes=2, status=JobStatus.SUCCEEDED)

    labelled = cli("logs", str(job_id), "--label")
    assert (labelled.exit_code, labelled.stderr) == (0, "")
    assert labelled.stdout == "0: step 1\n0: step 2\n1: ready\n1: no newline at the end\n"
    # Following: each node's stream in its own thread, whole lines, each node's in order.
    followed = cli("logs", str(job_id), "-l", "-f").stdout.splitlines()
    assert sorted(followed) == ["0: step 1", "0: step 2", "1: no newline at the end", "1: ready"]
    assert followed.index("0: step 1") < followed.index("0: step 2")
    both = cli("logs", str(job_id), "--label", "--node-rank", "1")
    assert both.exit_code == 2 and "leave out --node-rank" in both.stderr
