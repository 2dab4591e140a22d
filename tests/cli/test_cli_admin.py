"""admin create-user / create-token / revoke (direct database access)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.harness import Cli


def test_create_user_prints_a_working_token_and_duplicate_fails(cli: Cli) -> None:
    result = cli.raw(["admin", "create-user", "carol", "--project", "ml", "--project", "nlp"])
    assert result.exit_code == 0, result.stderr
    token = result.stdout.strip()
    assert token.startswith("gps_") and "\n" not in token  # stdout is the token only
    assert "carol" in result.stderr

    jobs = cli.raw(["jobs", "--json", "--url", cli.url, "--token", token])
    assert jobs.exit_code == 0, jobs.stderr
    # Member of two projects: a submission must name one, and nlp exists now.
    submit = cli.raw(
        ["submit", "--json", "--url", cli.url, "--token", token, "--project", "nlp", "--", "x"]
    )
    assert submit.exit_code == 0, submit.stderr
    assert json.loads(submit.stdout)["project"] == "nlp"

    again = cli.raw(["admin", "create-user", "carol", "--project", "ml"])
    assert again.exit_code == 1
    assert "already exists" in again.stderr and "Traceback" not in again.output


def test_create_user_admin_can_drain(cli: Cli) -> None:
    result = cli.raw(["admin", "create-user", "root2", "-p", "default", "--admin"])
    assert result.exit_code == 0, result.stderr
    token = result.stdout.strip()
    queues = cli.raw(["queues", "--json", "--url", cli.url, "--token", token])
    assert queues.exit_code == 0, queues.stderr


def test_create_user_needs_a_project(cli: Cli) -> None:
    result = cli.raw(["admin", "create-user", "dave"])
    assert result.exit_code == 2


def test_create_token_and_revoke(cli: Cli) -> None:
    result = cli.raw(["admin", "create-token", "alice"])
    assert result.exit_code == 0, result.stderr
    second = result.stdout.strip()
    assert cli.raw(["jobs", "--url", cli.url, "--token", second]).exit_code == 0

    revoked = cli.raw(["admin", "revoke", "alice"])
    assert revoked.exit_code == 0, revoked.stderr
    assert "revoked 2 token(s)" in revoked.stdout
    for token in (second, cli.tokens["alice"]):
        denied = cli.raw(["jobs", "--url", cli.url, "--token", token])
        assert denied.exit_code == 1 and "revoked" in denied.stderr

    for command in ("revoke", "create-token"):
        missing = cli.raw(["admin", command, "nobody"])
        assert missing.exit_code == 1 and "nobody" in missing.stderr


def test_admin_on_an_unmigrated_database_says_so(cli: Cli, tmp_path: Path) -> None:
    result = cli.raw(
        ["admin", "create-user", "eve", "-p", "ml"],
        GPUSCHED_DATABASE_URL=f"sqlite:///{tmp_path / 'empty.db'}",
    )
    assert result.exit_code == 2
    assert "gpusched migrate" in result.stderr and "Traceback" not in result.output
