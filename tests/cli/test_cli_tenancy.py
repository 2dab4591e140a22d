"""What the CLI shows of other users' jobs: never their environment's values, and never
a control character a terminal would obey (a job name that retitles or clears the reader's
terminal)."""

from __future__ import annotations

import json

from sqlalchemy import update

from app.jobs.models import Job
from tests.cli.harness import Cli

ESCAPES = "\x1b]0;TITLE\x07\x1b[2J"
SECRET = "AKIA-secret-value-7f3a"


def _submit(cli: Cli, *args: str, user: str = "alice") -> int:
    result = cli("submit", "--json", *args, user=user)
    assert result.exit_code == 0, result.stderr
    return int(json.loads(result.stdout)["id"])


def test_show_gives_a_jobs_environment_to_its_owner_only(cli: Cli) -> None:
    cli.add_user("dana", ["ml"])
    job = _submit(cli, "--env", f"AWS_SECRET_ACCESS_KEY={SECRET}", "--hold", "--", "true")
    mine = cli("show", str(job))
    assert f"AWS_SECRET_ACCESS_KEY={SECRET}" in mine.stdout
    for args in (["show", str(job)], ["show", "--json", str(job)], ["jobs", "--json"]):
        theirs = cli(*args, user="dana")
        assert theirs.exit_code == 0, theirs.stderr
        assert SECRET not in theirs.stdout and "AWS_SECRET_ACCESS_KEY" in theirs.stdout
    shown = " ".join(cli("show", str(job), user="dana").stdout.split())
    assert "AWS_SECRET_ACCESS_KEY (value hidden: not your job)" in shown


def test_control_characters_are_shown_escaped(cli: Cli) -> None:
    """A name stored before names were checked, or a command, holds escape sequences:
    `show`, `jobs` and `queue` print them written out."""
    job = _submit(cli, "--hold", "--label", "team=nlp", "--", "true")
    with cli.factory() as session:
        session.execute(update(Job).where(Job.id == job).values(name=f"evil{ESCAPES}"))
        session.commit()
    written = "evil\\x1b]0;TITLE\\x07\\x1b[2J"
    for args in (["show", str(job)], ["jobs"], ["queue"]):
        result = cli(*args, user="admin")
        assert result.exit_code == 0, result.stderr
        assert "\x1b" not in result.stdout and "\x07" not in result.stdout, args
        assert written in result.stdout, (args, result.stdout)
    held = cli("hold", str(job), user="admin")
    assert "\x1b" not in held.stdout and written in held.stdout
