"""`gpusched batch ...` against the real API served by uvicorn."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from app.batches.service import fire_due
from app.jobs.limits import RuntimeLimits
from tests.cli.harness import Cli


def batch(cli: Cli, sub: str, *args: str, user: str = "alice"):
    return cli.raw(["batch", sub, "--url", cli.url, "--token", cli.tokens[user], *args])


def test_create_single_job_from_command_and_list_show(cli: Cli, tmp_path: Path) -> None:
    r = batch(
        cli, "create", "nightly",
        "--cron", "0 2 * * *", "--tz", "Europe/Berlin",
        "--gpus", "4", "--env", "LR=0.1", "--workdir", str(tmp_path),
        "--", "python", "train.py", "--lr", "0.1",
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert "created batch nightly: 1 job(s)" in r.stdout and "Europe/Berlin" in r.stdout

    r = batch(cli, "list", "--json")
    assert r.exit_code == 0, r.stderr
    (item,) = json.loads(r.stdout)
    assert item["templates"] == [
        {
            "command": ["python", "train.py", "--lr", "0.1"],
            "gpus": 4,
            "env": {"LR": "0.1"},
            "workdir": str(tmp_path),
            "project": "ml",
        }
    ]
    assert item["next_fire_at"].endswith(("+01:00", "+02:00"))

    r = batch(cli, "list")
    assert r.exit_code == 0 and "nightly" in r.stdout and "0 2 * * *" in r.stdout

    r = batch(cli, "show", "nightly")
    assert r.exit_code == 0, r.stderr
    assert "python train.py --lr 0.1" in r.stdout and "no firings yet" in r.stdout


def test_create_from_template_file_offpeak(cli: Cli, tmp_path: Path) -> None:
    templates: list[dict[str, Any]] = [
        {"name": "prep", "command": ["python", "prep.py"], "gpus": 0},
        {"name": "train", "command": "python train.py", "gpus": 2, "after": [0]},
        {"name": "sweep", "command": "python sweep.py", "after": [1],
         "array": {"indices": "0-3", "max_running": 2}},
    ]  # fmt: skip
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps({"templates": templates}))
    create = (
        "create", "weekly", "--cron", "0 3 * * sun", "--tz", "UTC", "--offpeak",
        "--catch-up", "skip", "--concurrency", "replace", "--template-file", str(path), "--json",
    )  # fmt: skip
    # Off-peak work on a cluster without any window would never start.
    r = batch(cli, *create)
    assert r.exit_code == 1
    assert "window: no off-peak window is defined" in r.stderr
    r = cli.raw(
        ["window", "create", "--url", cli.url, "--token", cli.tokens["admin"],
         "night", "--tz", "UTC", "--daily", "22:00-06:00"]
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr

    r = batch(cli, *create)
    assert r.exit_code == 0, r.stderr
    body = json.loads(r.stdout)
    assert body["target"] == "offpeak" and body["catch_up"] == "skip"
    assert body["concurrency"] == "replace"
    assert [(t["name"], t.get("after")) for t in body["templates"]] == [
        ("prep", None),
        ("train", [0]),
        ("sweep", [1]),
    ]
    shown = batch(cli, "show", "weekly").stdout
    assert "python train.py (gpus 2, project ml, after job 0)" in shown
    assert "replace (a firing cancels earlier jobs that have not ended)" in shown
    assert "python sweep.py (gpus 1, project ml, array 0-3%2, after job 1)" in shown


def test_enable_disable_delete(cli: Cli) -> None:
    r = batch(cli, "create", "b1", "--cron", "*/5 * * * *", "--disabled", "--", "true")
    assert r.exit_code == 0, r.stderr
    assert "never (disabled)" in r.stdout
    r = batch(cli, "enable", "b1")
    assert r.exit_code == 0 and "b1: enabled, next" in r.stdout
    r = batch(cli, "disable", "b1")
    assert r.exit_code == 0 and "b1: disabled" in r.stdout
    r = batch(cli, "disable", "b1", user="bob")
    assert r.exit_code == 1 and "no batch named 'b1'" in r.stderr
    r = batch(cli, "delete", "b1")
    assert r.exit_code == 0 and "deleted batch b1" in r.stdout
    r = batch(cli, "show", "b1")
    assert r.exit_code == 1


def test_usage_and_server_errors_are_one_line(cli: Cli, tmp_path: Path) -> None:
    r = batch(cli, "create", "x", "--cron", "0 2 * * *")
    assert r.exit_code == 2 and "no jobs" in r.stderr
    r = batch(cli, "create", "x", "--cron", "0 2 * * *", "--window", "w", "--", "true")
    assert r.exit_code == 2 and "--window needs --offpeak" in r.stderr
    r = batch(cli, "create", "x", "--cron", "0 2 * * *", "--concurrency", "queue", "--", "true")
    assert r.exit_code == 2 and "--concurrency must be allow, forbid or replace" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    r = batch(cli, "create", "x", "--cron", "0 2 * * *", "--template-file", str(bad))
    assert r.exit_code == 2 and "expected a job object" in r.stderr
    r = batch(cli, "create", "x", "--cron", "0 25 * * *", "--", "true")
    assert r.exit_code == 1 and "cron:" in r.stderr
    r = batch(cli, "create", "x", "--cron", "0 2 * * *", "--gpus", "-3", "--", "true")
    assert r.exit_code == 1 and "templates.0.gpus" in r.stderr


def test_replace_changes_a_batch_in_place(cli: Cli, tmp_path: Path) -> None:
    base = ["--cron", "0 2 * * *", "--workdir", str(tmp_path)]
    assert batch(cli, "create", "nightly", *base, "--", "python", "a.py").exit_code == 0
    taken = batch(cli, "create", "nightly", *base, "--", "python", "b.py")
    assert taken.exit_code == 1 and "already exists" in taken.stderr

    r = batch(
        cli, "create", "nightly", "--cron", "30 3 * * *", "--tz", "Europe/Berlin",
        "--workdir", str(tmp_path), "--gpus", "2", "--replace", "--", "python", "b.py",
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert r.stdout.startswith("replaced batch nightly: 1 job(s) at '30 3 * * *' Europe/Berlin")
    (item,) = json.loads(batch(cli, "list", "--json").stdout)
    assert (item["cron"], item["timezone"]) == ("30 3 * * *", "Europe/Berlin")
    assert item["templates"][0]["command"] == ["python", "b.py"]
    assert item["templates"][0]["gpus"] == 2

    missing = batch(cli, "create", "weekly", *base, "--replace", "--", "true")
    assert missing.exit_code == 1 and "weekly" in missing.stderr


def test_show_says_why_a_firing_was_skipped(cli: Cli) -> None:
    r = batch(cli, "create", "hourly", "--cron", "0 * * * *", "--concurrency", "forbid", "--json",
              "--", "true")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    first = datetime.fromisoformat(json.loads(r.stdout)["next_fire_at"])
    for fire_at in (first, first + timedelta(hours=1)):  # the first job has not run
        fire_due(factory=cli.factory, limits=RuntimeLimits(), now=fire_at + timedelta(seconds=1))
    shown = batch(cli, "show", "hourly").stdout
    assert "skipped: jobs 1 of an earlier firing have not ended (concurrency: forbid)" in shown


def test_run_a_batch_by_hand(cli: Cli) -> None:
    r = batch(cli, "create", "eval", "--cron", "0 2 * * *", "--concurrency", "forbid", "--disabled",
              "--", "python", "eval.py")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    r = batch(cli, "run", "eval")
    assert (r.exit_code, r.stdout) == (0, "batch eval ran: job 1\n"), r.stderr
    shown = batch(cli, "show", "eval").stdout
    assert "run by alice" in shown
    r = batch(cli, "run", "eval")  # job 1 has not ended
    assert r.exit_code == 1
    assert "jobs 1 of an earlier firing have not ended (concurrency: forbid)" in r.stderr
    r = batch(cli, "run", "eval", "--json", user="bob")
    assert r.exit_code == 1 and "no batch named 'eval'" in r.stderr
