"""What the CLI shows of other users' jobs: never their environment's values, and never
a control character a terminal would obey (a job name that retitles or clears the reader's
terminal)."""

from __future__ import annotations

import json

from tests.cli.harness import Cli

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
