"""submit, jobs, show, cancel against the real API served by uvicorn."""

from __future__ import annotations

import io
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console
from sqlalchemy import select

from app.cli.client import CliError, parse_at
from app.cli.jobs.options import parse_slurm_time
from app.cli.jobs.views import jobs_table
from app.db import utcnow
from app.jobs.models import Job
from app.jobs.ranking import FORMAT, QueueRanking, pack
from app.jobs.states import JobStatus
from app.messaging import NullMessenger
from app.nodes.models import Node
from app.scheduling.types import ReasonKind
from tests.cli.harness import Cli


def _stored(cli: Cli, job_id: int) -> Job:
    with cli.factory() as session:
        job = session.scalar(select(Job).where(Job.id == job_id))
        assert job is not None
        return job


def _squeezed(text: str) -> str:
    """`show`'s output with the table's column padding folded to single spaces."""
    return " ".join(text.split())


def _submit_json(cli: Cli, *args: str, user: str = "alice") -> dict[str, Any]:
    result = cli("submit", "--json", *args, user=user)
    assert result.exit_code == 0, result.stderr
    body: dict[str, Any] = json.loads(result.stdout)
    return body


def _grant_priority(cli: Cli, up_to: int = 10) -> None:
    """As an admin: project ml's users may give their jobs priority up to `up_to`."""
    granted = cli("quota", "ml", "--max-priority", str(up_to), user="admin")
    assert granted.exit_code == 0, granted.stderr


def test_submit_argv_after_double_dash_keeps_command_env_and_labels(
    cli: Cli, tmp_path: Path
) -> None:
    _grant_priority(cli)
    result = cli(
        "submit",
        "--name", "train-1",
        "--gpus", "2",
        "--env", "LR=0.1",
        "--env", "EXTRA=a=b",
        "--label", "team=nlp",
        "--label", "exp=42",
        "--estimated-runtime", "1h30m",
        "--max-runtime", "2h",
        "--grace", "5m",
        "--priority", "5",
        "--retries", "2",
        "--preemptible",
        "--workdir", str(tmp_path),
        "--idempotency-key", "k-1",
        "--",
        "python", "train.py", "--lr", "0.1", "--",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "submitted job" in result.stdout and "PENDING" in result.stdout
    job_id = int(result.stdout.split("submitted job ")[1].split()[0])

    job = _stored(cli, job_id)
    assert job.command == ["python", "train.py", "--lr", "0.1", "--"]
    assert job.env == {"LR": "0.1", "EXTRA": "a=b"}
    assert job.labels == {"team": "nlp", "exp": "42"}
    assert job.name == "train-1" and job.gpus == 2 and job.priority == 5 and job.retries == 2
    assert job.estimated_runtime_s == 5400 and job.max_runtime_s == 7200
    assert job.grace_s == 300
    assert "grace 5m from SIGTERM to SIGKILL" in _squeezed(cli("show", str(job_id)).stdout)
    assert job.preemptible is True
    assert job.workdir == str(tmp_path)

    # Same idempotency key and body: the first job comes back, no second one.
    again = cli(
        "submit", "--name", "train-1", "--gpus", "2", "--env", "LR=0.1", "--env", "EXTRA=a=b",
        "--label", "team=nlp", "--label", "exp=42", "--estimated-runtime", "5400",
        "--max-runtime", "7200s", "--grace", "300", "--priority", "5", "--retries", "2",
        "--preemptible",
        "--workdir", str(tmp_path), "--idempotency-key", "k-1",
        "--", "python", "train.py", "--lr", "0.1", "--",
    )  # fmt: skip
    assert again.exit_code == 0, again.stderr
    assert f"already submitted job {job_id}" in again.stdout


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90 * 60),  # sbatch: a bare number is minutes (--max-runtime: seconds)
        ("30:15", 30 * 60 + 15),  # MM:SS
        ("1:30:00", 5400),  # HH:MM:SS
        ("2-12", 2 * 86400 + 12 * 3600),  # D-HH
        ("1-00:30", 86400 + 1800),  # D-HH:MM
        ("1-02:03:04", 86400 + 2 * 3600 + 3 * 60 + 4),  # D-HH:MM:SS
        ("2h", 7200),  # with units, as --max-runtime
        ("1h30m", 5400),
    ],
)
def test_time_limits_as_sbatch_writes_them(text: str, seconds: int) -> None:
    assert parse_slurm_time(text) == seconds


@pytest.mark.parametrize("text", ["", "1:2:3:4", "-5", "1-", "UNLIMITED", "1.5", "abc", "2 hours"])
def test_time_limits_sbatch_would_refuse_are_usage_errors(text: str) -> None:
    with pytest.raises(CliError) as refused:
        parse_slurm_time(text)
    assert refused.value.exit_code == 2 and "--time" in str(refused.value)
    # sbatch's forms, not --max-runtime's "seconds" (a bare number is minutes here).
    assert "expected minutes, MM:SS, HH:MM:SS or D-HH:MM:SS" in str(refused.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", "2026-11-25T15:00:00+00:00"),
        ("now+90", "2026-11-25T15:01:30+00:00"),  # seconds, as sbatch --begin
        ("now+1hour", "2026-11-25T16:00:00+00:00"),
        ("now+2days", "2026-11-27T15:00:00+00:00"),
        ("NOW+1W", "2026-12-02T15:00:00+00:00"),
        ("16:30", "2026-11-25T16:30:00+00:00"),  # its next occurrence: today
        ("14:30:15", "2026-11-26T14:30:15+00:00"),  # past today: tomorrow
        ("2030-01-02T03:04:05+01:00", "2030-01-02T03:04:05+01:00"),
    ],
)
def test_begin_times_as_sbatch_writes_them(text: str, expected: str) -> None:
    now = datetime(2026, 11, 25, 15, 0, tzinfo=UTC)
    assert parse_at(text, now) == datetime.fromisoformat(expected)


@pytest.mark.parametrize("text", ["now+", "now-5", "25:00", "tomorrow", "now+3fortnights"])
def test_begin_times_sbatch_would_refuse_are_usage_errors(text: str) -> None:
    with pytest.raises(CliError) as refused:
        parse_at(text)
    assert refused.value.exit_code == 2 and "now+COUNT[seconds|minutes" in str(refused.value)


def test_submit_and_update_take_sbatch_spellings(cli: Cli) -> None:
    body = _submit_json(
        cli, "-J", "sweep", "-N", "2", "-t", "1-00:00:00", "--begin", "2030-01-02T03:04:05Z",
        "--", "true",
    )  # fmt: skip
    job = _stored(cli, body["id"])
    assert (job.name, job.nodes, job.max_runtime_s) == ("sweep", 2, 86400)
    assert body["schedule"]["at"].startswith("2030-01-02T03:04:05")
    assert cli("update", str(job.id), "--time", "90").exit_code == 0
    assert _stored(cli, job.id).max_runtime_s == 5400  # 90 minutes, as scontrol reads it
    assert cli("update", str(job.id), "--time", "UNLIMITED").exit_code == 0  # scontrol's
    assert _stored(cli, job.id).max_runtime_s is None
    wrapped = _submit_json(cli, "--wrap", "python train.py --lr 1")  # sbatch --wrap
    assert wrapped["command"] == "python train.py --lr 1"
    both = cli("update", str(job.id), "-t", "none", "--max-runtime", "2h")
    assert both.exit_code == 2 and "the same limit: give one" in both.stderr
    both = cli("update", str(job.id), "-t", "90", "--max-runtime", "2h")
    assert both.exit_code == 2 and "the same limit: give one" in both.stderr
    both = cli("submit", "-t", "90", "--max-runtime", "2h", "--", "true")
    assert both.exit_code == 2 and "the same limit: give one" in both.stderr


def test_submit_without_double_dash_keeps_options_after_the_program(cli: Cli) -> None:
    body = _submit_json(cli, "python", "x.py", "--lr", "1")
    assert body["command"] == ["python", "x.py", "--lr", "1"]
    assert body["workdir"] == os.getcwd()  # the default


def test_submit_shell_offpeak_and_at(cli: Cli) -> None:
    unknown = cli("submit", "--offpeak", "--window", "night", "--", "true")
    assert unknown.exit_code == 1
    assert "schedule.window: no off-peak window named 'night'" in unknown.stderr
    night = {"name": "night", "timezone": "UTC", "daily": [{"start": "22:00", "end": "06:00"}]}
    admin = {"Authorization": f"Bearer {cli.tokens['admin']}"}
    httpx.post(f"{cli.url}/api/v1/windows", json=night, headers=admin).raise_for_status()

    body = _submit_json(cli, "--shell", "echo $HOME && ls", "--offpeak", "--window", "night")
    assert body["command"] == "echo $HOME && ls"
    assert body["schedule"] == {"mode": "offpeak", "at": None, "window": "night"}
    job = _stored(cli, body["id"])
    assert job.schedule_mode == "offpeak" and job.window == "night"

    body = _submit_json(cli, "--at", "2030-01-02T03:04:05+00:00", "--", "true")
    assert body["schedule"]["mode"] == "at"
    assert body["schedule"]["at"].startswith("2030-01-02T03:04:05")


def test_submit_usage_errors_exit_2_without_a_request(cli: Cli) -> None:
    for args, message in [
        (["submit"], "no command"),
        (["submit", "--shell", "ls", "--", "ls"], "either --shell or a command"),
        (["submit", "--env", "NOEQUALS", "--", "x"], "--env"),
        (["submit", "--estimated-runtime", "5q", "--", "x"], "--estimated-runtime"),
        (["submit", "--grace", "soon", "--", "x"], "--grace: 'soon'"),
        (["submit", "--window", "w", "--", "x"], "--window needs --offpeak"),
        (["submit", "--at", "tomorrow", "--", "x"], "--at"),
    ]:
        result = cli(*args)
        assert result.exit_code == 2, (args, result.stdout, result.stderr)
        assert message in result.stderr
        assert "Traceback" not in result.output


def test_server_validation_error_names_the_field_and_exits_1(cli: Cli) -> None:
    result = cli("submit", "--gpus=-1", "--", "echo", "hi")
    assert result.exit_code == 1
    assert "gpus: Input should be greater than or equal to 0" in result.stderr
    assert "Traceback" not in result.output

    result = cli("submit", "--env", "CUDA_VISIBLE_DEVICES=0", "--", "x")
    assert result.exit_code == 1
    assert "env:" in result.stderr and "CUDA_VISIBLE_DEVICES" in result.stderr

    result = cli("submit", "--project", "cv", "--", "x")  # alice is not in cv
    assert result.exit_code == 1 and "project:" in result.stderr

    result = cli("submit", "--grace", "1h", "--", "x")
    assert result.exit_code == 1
    assert "grace_s: 3600 s (1h) is above this cluster's longest grace period" in result.stderr


def test_connection_refused_exits_2_with_a_hint(cli: Cli, refused_url: str) -> None:
    result = cli.raw(["jobs", "--url", refused_url, "--token", "gps_x"])
    assert result.exit_code == 2
    assert (
        f"cannot reach gpusched at {refused_url}: connection refused — "
        "is `gpusched server` running?"
    ) in result.stderr
    assert "Traceback" not in result.output
    submit = cli.raw(["submit", "--url", refused_url, "--token", "gps_x", "--", "x"])
    assert submit.exit_code == 2 and "connection refused" in submit.stderr


def test_bad_token_is_a_rejected_request(cli: Cli) -> None:
    result = cli.raw(["jobs", "--url", cli.url, "--token", "gps_wrong"])
    assert result.exit_code == 1
    assert "invalid, expired or revoked token" in result.stderr


def test_url_and_token_come_from_settings_and_environment(cli: Cli) -> None:
    port = cli.url.rsplit(":", 1)[1]
    # GPUSCHED_TOKEN + the default URL built from GPUSCHED_HOST/GPUSCHED_PORT.
    result = cli.raw(["jobs", "--json"], GPUSCHED_TOKEN=cli.tokens["bob"], GPUSCHED_PORT=port)
    assert result.exit_code == 0, result.stderr
    # GPUSCHED_URL + the admin token file in the data dir.
    cli.settings.data_dir.mkdir(parents=True, exist_ok=True)
    cli.settings.admin_token_file.write_text(cli.tokens["admin"] + "\n")
    result = cli.raw(["nodes", "--json"], GPUSCHED_URL=cli.url)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_no_token_anywhere_is_a_usage_error(cli: Cli) -> None:
    result = cli.raw(["jobs", "--url", cli.url])
    assert result.exit_code == 2
    assert "no API token" in result.stderr and "--token" in result.stderr


def test_jobs_json_and_all_follows_pagination(cli: Cli) -> None:
    ids = [_submit_json(cli, "--name", f"j{i}", "--", "true")["id"] for i in range(5)]
    _submit_json(cli, "--name", "other", "--", "true", user="bob")

    result = cli("jobs", "--json", "--limit", "2")
    assert result.exit_code == 0, result.stderr
    page = json.loads(result.stdout)
    assert [j["id"] for j in page["items"]] == ids[::-1][:2]
    assert page["next_cursor"]

    result = cli("jobs", "--json", "--limit", "2", "--all")
    assert result.exit_code == 0, result.stderr
    everything = json.loads(result.stdout)
    assert sorted(j["id"] for j in everything["items"]) == sorted(ids)  # bob's job is hidden
    assert everything["next_cursor"] is None

    # The admin sees both users' jobs; filters go to the server.
    result = cli("jobs", "--json", "--all", "--user", "bob", user="admin")
    assert [j["name"] for j in json.loads(result.stdout)["items"]] == ["other"]
    # As squeue -u bob -t PENDING.
    result = cli("jobs", "--json", "-u", "bob", "-t", "PENDING", user="admin")
    assert [j["name"] for j in json.loads(result.stdout)["items"]] == ["other"]
    result = cli("jobs", "--json", "-u", "bob", "-t", "RUNNING", user="admin")
    assert json.loads(result.stdout)["items"] == []


def test_jobs_table_and_filters(cli: Cli) -> None:
    _submit_json(cli, "--name", "alpha", "--label", "team=nlp", "--", "true")
    beta = _submit_json(cli, "--name", "beta", "--gpus", "3", "--nodes", "2", "--", "true")
    assert cli("cancel", str(beta["id"])).exit_code == 0

    result = cli("jobs")
    assert result.exit_code == 0, result.stderr
    for text in ("ID", "NAME", "STATUS", "REASON", "AGE", "alpha", "beta", "alice", "ml"):
        assert text in result.stdout
    assert "3x2" in result.stdout  # GPUs per node x nodes
    assert "CANCELLED" in result.stdout

    # A job killed at its limit says which limit (it has no exit code of its own).
    timed_out = _submit_json(cli, "--name", "gamma", "--max-runtime", "1h30m", "--", "true")
    with cli.factory.begin() as session:
        session.get_one(Job, timed_out["id"]).status = JobStatus.TIMED_OUT
    assert "max runtime 1h30m" in cli("jobs", "--status", "TIMED_OUT").stdout

    result = cli("jobs", "--json", "--status", "pending", "--label", "team=nlp")
    assert [j["name"] for j in json.loads(result.stdout)["items"]] == ["alpha"]

    result = cli("jobs", "--status", "bogus")
    assert result.exit_code == 1 and "status" in result.stderr


def test_show_prints_pending_reason_and_events(cli: Cli) -> None:
    body = _submit_json(cli, "--name", "shown", "--label", "a=b", "--", "echo", "two words")
    result = cli("show", str(body["id"]))
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "shown" in out and "PENDING" in out
    assert "echo 'two words'" in out  # argv rendered as a shell would need it
    assert "pending reason" in out and body["pending_reason"] in out
    assert "Events" in out and "submitted" in out

    result = cli("show", "--json", str(body["id"]))
    shown = json.loads(result.stdout)
    assert shown["id"] == body["id"] and shown["events"][0]["to_status"] == "PENDING"

    missing = cli("show", "999999")
    assert missing.exit_code == 1 and "999999" in missing.stderr


def test_cancel(cli: Cli) -> None:
    body = _submit_json(cli, "--", "sleep", "100")
    result = cli("cancel", str(body["id"]))
    assert result.exit_code == 0, result.stderr
    assert f"job {body['id']}" in result.stdout and "CANCELLED" in result.stdout
    assert _stored(cli, body["id"]).status == "CANCELLED"
    # Idempotent, and --json gives the raw job.
    again = cli("cancel", "--json", str(body["id"]))
    assert again.exit_code == 0 and json.loads(again.stdout)["status"] == "CANCELLED"
    # Bob cannot cancel alice's job.
    other = cli("cancel", str(body["id"]), user="bob")
    assert other.exit_code == 1 and other.stderr.strip()


def test_cancel_with_a_grace_period_shorter_than_the_jobs(cli: Cli) -> None:
    job_id = _submit_json(cli, "--grace", "10m", "--", "sleep", "100")["id"]
    _start(cli, job_id)
    stopping = cli("cancel", str(job_id), "--grace", "30s")
    assert stopping.exit_code == 0, stopping.stderr
    assert stopping.stdout == f"job {job_id} (sleep): cancel requested, still RUNNING\n"
    assert cli("cancel", str(job_id), "--grace", "0").exit_code == 0
    shown = json.loads(cli("show", "--json", str(job_id)).stdout)
    assert [e["reason"] for e in shown["events"]][-2:] == [
        "cancel requested; stopping the process (grace at most 30s)",
        "cancel again (SIGKILL now)",
    ]
    bad = cli("cancel", str(job_id), "--grace", "now")
    assert bad.exit_code == 2 and "--grace: 'now'" in bad.stderr


def test_cancel_several_jobs_tries_each_and_fails_if_any_fails(cli: Cli) -> None:
    first, second = (_submit_json(cli, "--", "sleep", "100")["id"] for _ in range(2))
    bobs = _submit_json(cli, "--", "true", user="bob")["id"]
    result = cli("cancel", str(first), str(bobs), str(second), "99999")
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        f"job {first} (sleep): CANCELLED",
        f"job {second} (sleep): CANCELLED",
    ]
    errors = result.stderr.splitlines()
    assert [e.split(":")[0:2] for e in errors] == [
        ["error", f" job {bobs}"],
        ["error", " job 99999"],
    ]
    assert _stored(cli, bobs).status == "PENDING"  # not alice's: left alone
    listed = cli("cancel", "--json", str(first), str(second), str(first))
    assert listed.exit_code == 0
    assert [j["id"] for j in json.loads(listed.stdout)] == [first, second]


def test_cancel_the_jobs_a_filter_selects(cli: Cli) -> None:
    sweep = [_submit_json(cli, "--label", "sweep=lr", "--", "true")["id"] for _ in range(2)]
    other = _submit_json(cli, "--", "true")["id"]
    bobs = _submit_json(cli, "--label", "sweep=lr", "--", "true", user="bob")["id"]
    done = _submit_json(cli, "--label", "sweep=lr", "--", "true")["id"]
    assert cli("cancel", str(done)).exit_code == 0

    result = cli("cancel", "--label", "sweep=lr")
    assert result.exit_code == 0, result.stderr
    # One request, counts and ids; the cancelled one has ended, so it is not selected.
    assert result.stdout == f"cancelled 2 jobs: {sweep[0]}-{sweep[1]}\n"
    assert _stored(cli, other).status == "PENDING" and _stored(cli, bobs).status == "PENDING"

    # Selected by user and state, spelled as scancel -u alice -t PENDING; --json is the
    # API's counts and ids, not the jobs (issue 42: 20,000 jobs were 20 MB).
    mine = cli("cancel", "--json", "-u", "alice", "-t", "pending")
    assert json.loads(mine.stdout) == {"count": 1, "ids": [other], "more": 0, "stopping": 0}
    none = cli("cancel", "--user", "alice")
    assert (none.exit_code, none.stderr) == (0, "no jobs match\n")
    both = cli("cancel", str(other), "--user", "alice")
    assert both.exit_code == 2 and "not both" in both.stderr
    assert cli("cancel").exit_code == 2


def test_show_prints_queue_position_and_allocations(cli: Cli) -> None:
    from app.nodes.models import Allocation
    from tests.cli.test_cli_cluster import _add_node

    _add_node(cli, "gpu-a", 2)
    waiting = _submit_json(cli, "--name", "waiting", "--", "true")
    placed = _submit_json(cli, "--name", "placed", "--gpus", "2", "--", "true")
    with cli.factory() as session:
        job = session.get(Job, waiting["id"])
        assert job is not None
        job.queue_position = 3  # ranked; its place: third in the last ranking
        session.add(
            QueueRanking(
                name="queue",
                ranked_at=utcnow(),
                ranking={"policy": "fifo"},
                ranks={
                    "format": FORMAT,
                    "size": [3600.0],
                    "from": [0],
                    "sources": ["the default"],
                    "priority": [0],
                    "project": [0],
                    "projects": ["ml"],
                    "starving": [],
                },
                packed=pack([-2, -1, waiting["id"]], [0] * 3),
                ranks_id="test-show",
            )
        )
        job.pending_reason = ReasonKind.WAITING_FOR_GPUS.value
        job.pending_message = "needs 1 free GPU; none free"
        running = session.get(Job, placed["id"])
        assert running is not None
        running.status = JobStatus.RUNNING  # allocations are shown for active jobs only
        node = session.scalar(select(Node).where(Node.name == "gpu-a"))
        assert node is not None
        for rank, gpu in enumerate(node.gpus):
            session.add(
                Allocation(
                    job_id=placed["id"], attempt=0, node_id=node.id, gpu_id=gpu.id, rank=rank
                )
            )
        session.commit()

    out = cli("show", str(waiting["id"])).stdout
    assert "queue position" in out and "3" in out
    assert "waiting_for_gpus" in out and "needs 1 free GPU; none free" in out

    result = cli("show", str(placed["id"]))
    assert result.exit_code == 0, result.stderr
    assert "Allocations" in result.stdout and "gpu-a" in result.stdout
    shown = json.loads(cli("show", "--json", str(placed["id"])).stdout)
    assert [(a["node"], a["gpu_index"]) for a in shown["allocations"]] == [
        ("gpu-a", 0),
        ("gpu-a", 1),
    ]


def test_jobs_table_keeps_one_line_per_job_on_a_narrow_terminal() -> None:
    reason = (
        "waiting for 4 GPUs (largest free block 0); within quota: borrowed GPUs are reclaimed"
        " once a borrowing job has run 10 min (from 2026-11-23T08:59:54+00:00)"
    )
    jobs = [
        {"id": 12, "name": "train", "project": "ml", "user": "alice", "status": "PENDING",
         "gpus": 4, "pending_message": reason},
        {"id": 13, "name": "eval", "project": "cv", "user": "bob", "status": "RUNNING",
         "gpus": 1},
    ]  # fmt: skip

    def render(width: int) -> list[str]:
        out = Console(file=io.StringIO(), width=width)
        out.print(jobs_table(jobs, width=width))
        return out.file.getvalue().splitlines()  # type: ignore[attr-defined]

    narrow = render(80)
    # Borders, header and one line per job, then the caption; exactly 80 wide.
    [row_12] = [line for line in narrow if "│ 12 " in line]
    assert (
        row_12 == "│ 12 │ train │ ml      │ alice │ PENDING │ 4    │ waiting for 4 GPUs (l… │     │"
    )
    assert narrow[6].rstrip() == "reasons cut to fit: gpusched show ID has them whole"
    assert len(narrow) == 7 and max(map(len, narrow)) == 80
    wide = render(250)
    assert len(wide) == 6 and any(reason in line for line in wide)


def test_jobs_and_queue_cut_no_reason_in_a_pipe(cli: Cli) -> None:
    held = _submit_json(cli, "--hold", "--", "true")
    whole = held["pending_message"]
    assert len(whole) > 40, whole  # longer than an 80-column table leaves for it
    for command in ("jobs", "queue"):
        # CliRunner's stdout is not a terminal, as `gpusched jobs | grep held` is not.
        piped = cli(command, COLUMNS=None)
        assert piped.exit_code == 0, piped.stderr
        assert whole in piped.stdout and "cut to fit" not in piped.stdout
        # An explicit width still applies, as on a terminal of that size.
        narrow = cli(command, COLUMNS="80")
        assert whole not in narrow.stdout and "cut to fit" in narrow.stdout


def test_queue_lists_pending_jobs_in_scheduling_order_with_estimated_start(cli: Cli) -> None:
    from app.cycle.run import run_cycle
    from app.cycle.settings import SchedulerSettings
    from app.db import utcnow
    from tests.foundation.builders import ready_node

    now = utcnow()
    with cli.factory.begin() as session:
        session.add(ready_node("gpu-a", gpus=2, now=now, idle_since=now - timedelta(hours=1)))
    settings = SchedulerSettings(stability_window_s=0)

    def cycle() -> None:
        run_cycle(
            factory=cli.factory, messenger=NullMessenger(), settings=settings, holder="t", now=now
        )

    first = _submit_json(cli, "--name", "first", "--estimated-runtime", "5m", "--", "true")
    running = _submit_json(cli, "--name", "running", "--max-runtime", "2h", "--", "true")
    big = _submit_json(cli, "--name", "big", "--gpus", "2", "--", "true")
    cycle()  # first and running start, one GPU each (shorter), big waits
    # Positions count the jobs still waiting: big is next, not third.
    assert [j["queue_position"] for j in json.loads(cli("queue", "--json").stdout)["items"]] == [1]
    small = _submit_json(cli, "--name", "small", "--estimated-runtime", "10m", "--", "true")
    cycle()
    assert {_stored(cli, j["id"]).status for j in (first, running)} == {"SCHEDULED"}

    page = json.loads(cli("queue", "--json").stdout)
    assert page["total"] == 2
    # The short job goes first (expected GPU-time), counted among the jobs still waiting.
    assert [(j["name"], j["queue_position"]) for j in page["items"]] == [("small", 1), ("big", 2)]

    result = cli("queue")
    assert result.exit_code == 0, result.stderr
    header = next(line for line in result.stdout.splitlines() if "┃" in line)
    columns = [c.strip() for c in header.split("┃")[1:-1]]
    assert columns == ["POS", "ID", "NAME", "PROJECT", "USER", "GPUS", "START", "REASON"]
    rows = [line for line in result.stdout.splitlines() if "│" in line]
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in rows]
    assert [row[:6] for row in cells] == [
        ["1", str(small["id"]), "small", "ml", "alice", "1"],
        ["2", str(big["id"]), "big", "ml", "alice", "2"],
    ]
    # Both wait for a GPU; the head's reservation starts when `first` is expected to end.
    assert cells[0][6] in ("in 4m", "in 5m") and cells[1][6] == ""
    assert cells[0][7].startswith("waiting for 1 GPU") and cells[1][7].startswith("waiting for")

    limited = cli("queue", "--limit", "1")
    assert "1 more pending" in limited.stdout and "big" not in limited.stdout
    assert "no pending jobs" in cli("queue", user="bob").stdout  # bob sees only his projects
    # As squeue --name / -u: the cluster's positions, filtered.
    named = json.loads(cli("queue", "--json", "-n", "big", "-u", "alice").stdout)
    assert [(j["name"], j["queue_position"]) for j in named["items"]] == [("big", 2)]


def test_hold_and_release(cli: Cli) -> None:
    first, second = (_submit_json(cli, "--", "sleep", "100")["id"] for _ in range(2))
    held = cli("hold", str(first), str(second))
    assert held.exit_code == 0, held.stderr
    assert held.stdout.splitlines() == [
        f"job {first} (sleep): held by alice",
        f"job {second} (sleep): held by alice",
    ]
    assert "held by alice" in cli("jobs").stdout  # the REASON column
    released = cli("release", "--json", str(first))
    assert released.exit_code == 0 and json.loads(released.stdout)["held_by"] is None
    assert cli("release", str(first)).stdout == f"job {first} (sleep): PENDING\n"
    assert cli("cancel", str(first)).exit_code == 0
    refused = cli("hold", str(first))
    assert refused.exit_code == 1 and "only a pending job can be held" in refused.stderr

    # Selected by the options: one request; a job an admin held keeps every job held.
    bobs = _submit_json(cli, "--", "true", user="bob")["id"]
    assert cli("hold", "--user", "alice").stdout == f"held 1 job: {second}\n"
    third = _submit_json(cli, "--", "sleep", "1")["id"]
    assert cli("hold", str(third), user="admin").exit_code == 0
    refused = cli("release", "--user", "alice")
    assert refused.exit_code == 1 and f"jobs {third} were held by an admin" in refused.stderr
    assert _stored(cli, second).held_by == "alice"
    released = cli("release", "--json", "--user", "alice", user="admin")
    assert json.loads(released.stdout)["ids"] == [second, third]
    none = cli("release", "--user", "alice")
    assert (none.exit_code, none.stderr) == (0, "no held jobs match\n")
    assert _stored(cli, bobs).held_by is None
    assert cli("hold", str(second), "--user", "alice").exit_code == 2  # ids or options
    submitted = cli("submit", "--hold", "--", "true")
    assert submitted.exit_code == 0, submitted.stderr
    assert "held by alice: gpusched release" in submitted.stdout


def test_submit_after_another_job(cli: Cli) -> None:
    train = _submit_json(cli, "--name", "train", "--", "true")["id"]
    result = cli("submit", "--after", str(train), "--name", "eval", "--", "true")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == (
        f"submitted job {train + 1} (eval): PENDING — waiting for job {train} (train) to succeed\n"
    )
    shown = cli("show", str(train + 1)).stdout.splitlines()
    assert f"depends on       {train} (must succeed)" in [line.rstrip() for line in shown]
    refused = cli("submit", "--after", "999", "--", "true")
    assert refused.exit_code == 1 and "depends_on: no job 999 in your projects" in refused.stderr

    # Slurm's other kinds: a cleanup step runs however train ends.
    cleanup = _submit_json(cli, "--dependency", f"afterany:{train}:{train + 1}", "--", "true")
    assert (cleanup["dependency"], cleanup["depends_on"]) == ("afterany", [train, train + 1])
    shown = [line.rstrip() for line in cli("show", str(cleanup["id"])).stdout.splitlines()]
    assert f"depends on       {train}, {train + 1} (must end)" in shown
    # A monitor beside a run starts once it has started (sbatch --dependency=after:ID).
    monitor = _submit_json(cli, "--dependency", f"after:{train}", "--", "true")
    assert monitor["pending_message"] == f"waiting for job {train} (train) to start"
    shown = [line.rstrip() for line in cli("show", str(monitor["id"])).stdout.splitlines()]
    assert f"depends on       {train} (must start)" in shown
    # A singleton names no job: one "nightly" of alice's at a time.
    nightly = [
        _submit_json(cli, "--name", "nightly", "--dependency", "singleton", "--", "true")
        for _ in range(2)
    ]
    assert nightly[1]["pending_message"] == (
        f"waiting for job {nightly[0]['id']} (nightly) to end: one job named 'nightly' at a time"
    )
    shown = [line.rstrip() for line in cli("show", str(nightly[1]["id"])).stdout.splitlines()]
    assert "depends on       singleton: one job named 'nightly' of yours at a time" in shown
    for args, message in (
        (("--dependency", "singleton:1"), "--dependency: singleton names no jobs"),
        (("--dependency", "afterwards:1"), "'afterwards' is not one of afterok, afterany"),
        (("--dependency", "afterany:x"), "expected afterany:ID[:ID...], got 'afterany:x'"),
        (("--dependency", "afterany:1", "--after", "1"), "give --after or --dependency"),
    ):
        bad = cli("submit", *args, "--", "true")
        assert bad.exit_code == 2 and message in bad.stderr, bad.stderr


def test_submit_an_array_list_show_and_cancel_it(cli: Cli) -> None:
    result = cli("submit", "--array", "0-6:2%2", "--name", "sweep", "--", "true")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == (
        "submitted array 1 (sweep): 4 tasks, jobs 1-4, at most 2 at once"
        " (gpusched jobs/cancel --array 1)\n"
    )
    listed = cli("jobs", "--array", "1", "--json")
    tasks = sorted(json.loads(listed.stdout)["items"], key=lambda j: j["id"])
    assert [t["array"]["index"] for t in tasks] == [0, 2, 4, 6]
    table = cli("jobs", "--array", "1").stdout
    assert "sweep[4]" in table and "sweep[6]" in table
    shown = [line.rstrip() for line in cli("show", "3").stdout.splitlines()]
    assert "array            task 4 of array 1 (4 tasks, at most 2 at once)" in shown

    other = _submit_json(cli, "--", "true")["id"]
    changed = cli("update", "2", "--array-limit", "3")
    assert (changed.exit_code, changed.stdout) == (0, "updated array 1: at most 3 at once\n")
    assert _stored(cli, 4).array_max_running == 3
    assert cli("update", "2", "--array-limit", "none").stdout == "updated array 1: no limit\n"
    bad = cli("update", "2", "--array-limit", "0")
    assert bad.exit_code == 2 and "--array-limit: expected a positive number or none" in bad.stderr
    refused = cli("update", str(other), "--array-limit", "2")
    assert refused.exit_code == 1 and "not a task of a job array" in refused.stderr

    held = cli("hold", "--array", "1")
    assert held.exit_code == 0, held.stderr
    assert held.stdout == "held 4 jobs: 1-4\n"
    assert all(_stored(cli, t["id"]).held_by == "alice" for t in tasks)
    assert _stored(cli, other).held_by is None
    assert cli("release", "--array", "1").stdout == "released 4 jobs: 1-4\n"
    assert _stored(cli, 4).held_by is None
    both = cli("hold", "1", "--array", "1")
    assert both.exit_code == 2 and "give job ids or filter options" in both.stderr
    assert cli("release").exit_code == 2
    nothing = cli("hold", "--json", "--array", "999")
    assert (nothing.exit_code, json.loads(nothing.stdout), nothing.stderr) == (
        0,
        {"count": 0, "ids": [], "more": 0, "stopping": 0},
        "",
    )

    cancelled = cli("cancel", "--array", "1")  # one request for the whole array
    assert cancelled.exit_code == 0, cancelled.stderr
    assert cancelled.stdout == "cancelled 4 jobs: 1-4\n"
    assert [_stored(cli, t["id"]).status for t in tasks] == [JobStatus.CANCELLED] * 4
    assert _stored(cli, other).status == JobStatus.PENDING  # not of the array
    again = cli("cancel", "--array", "1", "--json")
    assert (again.exit_code, json.loads(again.stdout)["count"]) == (0, 0)
    assert cli("cancel", "--array", "1").stderr == "no jobs match\n"

    for bad, message in (
        ("0-3%x", "--array: '0-3%x': expected indices with an optional %N"),
        ("3-1", "--array: range '3-1' ends before it starts"),
    ):
        refused = cli("submit", "--array", bad, "--", "true")
        assert refused.exit_code == 2 and message in refused.stderr, refused.stderr


def test_cancelling_an_arrays_id_says_it_was_task_0_only(cli: Cli) -> None:
    first = _submit_json(cli, "--array", "0-2", "--name", "sweep", "--", "true")["id"]
    result = cli("cancel", str(first))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == (
        f"job {first} (sweep[0]): CANCELLED; task 0 only: "
        f"`gpusched cancel --array {first}` cancels the array's 3 tasks\n"
    )
    assert cli("cancel", str(first + 1)).stdout == f"job {first + 1} (sweep[1]): CANCELLED\n"
    assert _stored(cli, first + 2).status == JobStatus.PENDING


def test_update_a_pending_job(cli: Cli) -> None:
    _grant_priority(cli)
    job = _submit_json(cli, "--max-runtime", "2h", "--", "true")["id"]
    result = cli("update", str(job), "--gpus", "2", "--max-runtime", "none", "--priority", "3")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == (
        f"updated job {job} (true): PENDING — changed; waiting for the next scheduling cycle\n"
    )
    shown = json.loads(cli("show", "--json", str(job)).stdout)
    assert (shown["gpus"], shown["priority"], shown["max_runtime_s"]) == (2, 3, None)
    assert cli("update", str(job), "--gpu-memory-mb", "20000").exit_code == 0
    assert _stored(cli, job).gpu_memory_mb == 20000
    assert cli("update", str(job), "--gpu-memory-mb", "none").exit_code == 0
    assert _stored(cli, job).gpu_memory_mb is None  # any GPU with room, as if never asked
    assert cli("update", str(job), "--grace", "90s").exit_code == 0
    assert _stored(cli, job).grace_s == 90
    assert "grace 90s from SIGTERM" in _squeezed(cli("show", str(job)).stdout)
    assert cli("update", str(job), "--grace", "none").exit_code == 0
    assert _stored(cli, job).grace_s is None  # the agent's own again
    nothing = cli("update", str(job))
    assert nothing.exit_code == 2 and "nothing to change" in nothing.stderr
    refused = cli("update", str(job), "--priority", "5000")
    assert refused.exit_code == 1 and "priority" in refused.stderr


def test_update_a_pending_jobs_dependency(cli: Cli) -> None:
    train, other = (_submit_json(cli, "--", "true")["id"] for _ in range(2))
    job = _submit_json(cli, "--after", str(train), "--", "true")["id"]
    result = cli("update", str(job), "--dependency", f"afterany:{train}:{other}")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == (
        f"updated job {job} (true): PENDING — waiting for job {train} (true) and 1 more to end\n"
    )
    stored = _stored(cli, job)
    assert (stored.dependency_kind, stored.depends_on) == ("afterany", [train, other])
    assert cli("update", str(job), "--dependency", "none").exit_code == 0
    stored = _stored(cli, job)
    assert (stored.dependency_kind, stored.depends_on, stored.dependencies_met) == (
        "afterok",
        [],
        True,
    )
    assert cli("update", str(job), "--dependency", "singleton").exit_code == 0
    assert _stored(cli, job).dependency_kind == "singleton"
    for bad, code, message in [
        ("afterok:x", 2, "expected afterok:ID"),
        ("before:1", 2, "is not one of"),
        (f"afterok:{job}", 1, "cannot wait for itself"),
    ]:
        refused = cli("update", str(job), "--dependency", bad)
        assert refused.exit_code == code and message in refused.stderr, refused.stderr


def test_update_every_pending_task_of_an_array(cli: Cli) -> None:
    _grant_priority(cli)
    array = _submit_json(cli, "--array", "0-2", "--", "true")["id"]
    result = cli("update", "--array", str(array), "--priority", "7", "--array-limit", "1")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"updated 3 jobs: {array}-{array + 2}",
        f"updated array {array}: at most 1 at once",
    ]
    assert [_stored(cli, array + i).priority for i in range(3)] == [7, 7, 7]
    as_json = cli("update", "--array", str(array), "--priority", "8", "--json")
    assert json.loads(as_json.stdout)["ids"] == [array, array + 1, array + 2]
    assert [_stored(cli, array + i).priority for i in range(3)] == [8, 8, 8]
    for args, message in [
        (["--priority", "1"], "no jobs: give job ids or select them"),
        ([str(array), "--array", str(array), "--priority", "1"], "not both"),
        (["--user", "alice", "--array-limit", "2"], "--array-limit needs a job id or --array"),
    ]:
        refused = cli("update", *args)
        assert refused.exit_code == 2 and message in refused.stderr, refused.stderr
    nothing = cli("update", "--user", "nobody", "--priority", "1")
    assert (nothing.exit_code, nothing.stdout, nothing.stderr) == (0, "", "no pending jobs match\n")


def _start(cli: Cli, job_id: int) -> None:
    """As the agent's reports would: the job was placed and runs."""
    from app.jobs.lifecycle import transition

    with cli.factory.begin() as session:
        job = session.get_one(Job, job_id)
        for step in (JobStatus.SCHEDULED, JobStatus.RUNNING):
            transition(session, job=job, to=step, actor="agent:gpu-a")


def _end(cli: Cli, job_id: int, status: JobStatus, exit_code: int | None = None) -> None:
    """As the agent's report would: the job ran and ended this way."""
    from app.jobs.lifecycle import transition

    with cli.factory.begin() as session:
        job = session.get_one(Job, job_id)
        for step in (JobStatus.SCHEDULED, JobStatus.RUNNING, status):
            transition(session, job=job, to=step, actor="agent:gpu-a")
        job.exit_code = exit_code


def test_wait_returns_when_the_jobs_end_with_their_exit_status(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.cli.jobs.submit as jobs_cli

    ends: list[tuple[int, JobStatus, int | None]] = []

    def meanwhile(seconds: float) -> None:  # instead of sleeping: the jobs end
        assert seconds == jobs_cli.WAIT_POLLS_S[0]
        for job_id, status, code in ends:
            _end(cli, job_id, status, code)
        ends.clear()

    monkeypatch.setattr(jobs_cli, "_pause", meanwhile)
    ends.append((1, JobStatus.SUCCEEDED, 0))
    done = cli("submit", "--wait", "--", "true")
    assert (done.exit_code, done.stdout.splitlines()[1:]) == (
        0,
        ["job 1 (true): SUCCEEDED (exit 0)"],
    )

    failing, cancelled = (_submit_json(cli, "--", "true")["id"] for _ in range(2))
    ends.extend([(failing, JobStatus.FAILED, 3), (cancelled, JobStatus.CANCELLED, None)])
    result = cli("wait", str(failing), str(cancelled))
    assert result.exit_code == 3  # the first job that did not succeed, as sbatch --wait
    assert result.stdout.splitlines() == [
        f"job {failing} (true): FAILED (exit 3)",
        f"job {cancelled} (true): CANCELLED",
    ]
    assert cli("wait", str(cancelled)).exit_code == 1  # ended without an exit code

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(jobs_cli, "_pause", interrupted)
    pending = _submit_json(cli, "--", "true")["id"]
    stopped = cli("wait", "--json", str(pending))
    assert stopped.exit_code == 130 and stopped.stdout == ""
    assert f"stopped waiting; still running or pending: {pending}" in stopped.stderr
    assert json.loads(cli("show", "--json", str(pending)).stdout)["status"] == "PENDING"


def test_submit_an_array_and_wait_for_every_task(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    import app.cli.jobs.submit as jobs_cli

    def meanwhile(seconds: float) -> None:  # the tasks end while the CLI waits
        _end(cli, 1, JobStatus.SUCCEEDED, 0)
        _end(cli, 2, JobStatus.FAILED, 4)

    monkeypatch.setattr(jobs_cli, "_pause", meanwhile)
    result = cli("submit", "--array", "0-1", "--wait", "--", "true")
    assert result.exit_code == 4  # a task failed: its exit code, as sbatch --wait
    assert result.stdout.splitlines() == [
        "submitted array 1 (true): 2 tasks, jobs 1-2 (gpusched jobs/cancel --array 1)",
        "job 1 (true[0]): SUCCEEDED (exit 0)",
        "job 2 (true[1]): FAILED (exit 4)",
    ]


def test_wait_rides_out_an_api_restart_but_not_an_api_that_never_answered(
    cli: Cli, refused_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import app.cli.jobs.submit as jobs_cli
    from app.cli.client import ApiClient, Unreachable

    job_id = _submit_json(cli, "--", "true")["id"]
    client = ApiClient(base_url=cli.url, token=cli.tokens["alice"])
    pauses: list[float] = []

    def meanwhile(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 1:  # the API goes away after the first answer...
            client.base_url = refused_url
        elif len(pauses) == 3:  # ...and is back two polls later, the job done meanwhile
            client.base_url = cli.url
            _end(cli, job_id, JobStatus.SUCCEEDED, 0)

    monkeypatch.setattr(jobs_cli, "_pause", meanwhile)
    assert jobs_cli.wait_for(client, [job_id], as_json=False) == 0
    out = capsys.readouterr()
    assert out.out == f"job {job_id} (true): SUCCEEDED (exit 0)\n"
    assert out.err.count("still waiting") == 1 and "cannot reach gpusched" in out.err
    assert pauses[1:] == [jobs_cli.WAIT_POLLS_S[-1]] * 2  # retried at the slowest pace

    never = ApiClient(base_url=refused_url, token=cli.tokens["alice"])
    with pytest.raises(Unreachable):
        jobs_cli.wait_for(never, [job_id], as_json=False)


def test_requeue_a_running_job_back_held(cli: Cli) -> None:
    job_id = _submit_json(cli, "--name", "train", "--", "sleep", "100")["id"]
    _start(cli, job_id)
    result = cli("requeue", str(job_id), "--hold")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"job {job_id} (train): stopping, then back held by alice\n"
    stored = _stored(cli, job_id)
    assert stored.preempt_requested_at is not None and stored.held_by == "alice"
    listed = cli("jobs", "--status", "RUNNING").stdout
    assert "stopping, then back in the queue" in listed
    # Not running: refused, with the server's reason; every id is tried.
    pending = _submit_json(cli, "--", "true")["id"]
    refused = cli("requeue", str(pending), str(job_id))
    assert refused.exit_code == 1
    assert "only a placed or running job can be requeued" in refused.stderr
    assert f"job {job_id} (train): stopping, then back held by alice" in refused.stdout
    other = _submit_json(cli, "--", "sleep", "100")["id"]
    _start(cli, other)
    plain = cli("requeue", str(other))
    assert plain.stdout == f"job {other} (sleep): stopping, then back in the queue\n"


def test_submit_and_update_a_jobs_choice_of_nodes(cli: Cli) -> None:
    # No node has registered with this server, so any names are taken as given.
    job = _submit_json(cli, "--only-nodes", "gpu-2, gpu-1", "-x", "gpu-3", "--", "true")["id"]
    stored = _stored(cli, job)
    assert (stored.only_nodes, stored.exclude_nodes) == (["gpu-1", "gpu-2"], ["gpu-3"])
    shown = _squeezed(cli("show", str(job)).stdout)
    assert "only on gpu-1, gpu-2" in shown and "excludes gpu-3" in shown
    assert cli("update", str(job), "--only-nodes", "none", "--exclude", "gpu-1").exit_code == 0
    stored = _stored(cli, job)
    assert (stored.only_nodes, stored.exclude_nodes) == (None, ["gpu-1"])
    refused = cli("submit", "--exclude", " , ", "--", "true")
    assert refused.exit_code == 2 and "--exclude: expected node names" in refused.stderr


def test_list_and_cancel_jobs_by_name(cli: Cli) -> None:
    ids = [_submit_json(cli, "--name", "sweep", "--hold", "--", "true")["id"] for _ in range(2)]
    keep = _submit_json(cli, "--name", "train", "--hold", "--", "true")["id"]
    listed = json.loads(cli("jobs", "--name", "sweep", "--json").stdout)
    assert sorted(job["id"] for job in listed["items"]) == ids
    result = cli("cancel", "-n", "sweep")
    assert result.exit_code == 0, result.stderr
    assert [_stored(cli, i).status for i in ids] == ["CANCELLED", "CANCELLED"]
    assert _stored(cli, keep).status == "PENDING"


def test_show_prints_a_waiting_jobs_rank(cli: Cli) -> None:
    from app.cycle.run import run_cycle
    from app.db import utcnow
    from tests.cycle.jobs_api import SETTINGS

    ids = [json.loads(cli("submit", "--json", "--", "true").stdout)["id"] for _ in range(2)]
    run_cycle(
        factory=cli.factory, messenger=NullMessenger(), settings=SETTINGS, holder="t", now=utcnow()
    )
    shown = cli("show", str(ids[1]))
    assert shown.exit_code == 0, shown.stderr
    shown_text = " ".join(shown.stdout.split())
    assert "queue rank 2 of 2 waiting; ahead of it: 1 by submitted earlier" in shown_text
    as_json = json.loads(cli("show", "--json", str(ids[1])).stdout)
    assert as_json["rank"]["position"] == 2
    # Submitted after the full cycle: not ranked yet, and said so (not a 409, nothing shown).
    late = json.loads(cli("submit", "--json", "--", "true").stdout)["id"]
    shown = " ".join(cli("show", str(late)).stdout.split())
    assert "queue rank not ranked yet: the scheduler's next full cycle ranks it" in shown
