"""admin create-user / create-token / revoke (direct database access)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
    """And which database it opened, and how to point at another."""
    empty = tmp_path / "empty.db"
    empty.touch()  # a database with no tables (one missing altogether: below)
    result = cli.raw(
        ["admin", "create-user", "eve", "-p", "ml"], GPUSCHED_DATABASE_URL=f"sqlite:///{empty}"
    )
    assert result.exit_code == 2
    assert "gpusched migrate" in result.stderr and "Traceback" not in result.output
    assert result.stderr.startswith(f"error: cannot use the database at sqlite:///{empty}: ")
    assert "(GPUSCHED_DATABASE_URL's); run the command where `gpusched up`" in result.stderr


def test_add_to_and_remove_from_projects(cli: Cli) -> None:
    token = cli.tokens["alice"]

    def submit_to(project: str):  # type: ignore[no-untyped-def]
        args = ["submit", "--url", cli.url, "--token", token, "--project", project, "--", "x"]
        return cli.raw(args)

    denied = submit_to("cv")
    assert denied.exit_code == 1 and "not a member of project 'cv'" in denied.stderr

    added = cli.raw(["admin", "add-to-project", "alice", "-p", "cv", "-p", "nlp"])
    assert added.exit_code == 0, added.stderr
    assert added.stdout.strip() == "'alice' is now in project(s) cv, ml, nlp"
    assert submit_to("cv").exit_code == 0  # the same token, at once: the cache was cleared
    again = cli.raw(["admin", "add-to-project", "alice", "-p", "cv"])  # idempotent
    assert again.stdout.strip() == "'alice' is now in project(s) cv, ml, nlp"

    removed = cli.raw(["admin", "remove-from-project", "alice", "-p", "cv", "-p", "nlp"])
    assert removed.exit_code == 0 and removed.stdout.strip() == "'alice' is now in project(s) ml"
    assert submit_to("cv").exit_code == 1

    for args, words in (
        (["remove-from-project", "alice", "-p", "ml"], "would be left without a project"),
        (["remove-from-project", "alice", "-p", "cv"], "'alice' is not in project(s) cv"),
        (["add-to-project", "nobody", "-p", "cv"], "no user named 'nobody'"),
    ):
        result = cli.raw(["admin", *args])
        assert result.exit_code == 1 and words in result.stderr, (args, result.stderr)
    assert cli.raw(["admin", "add-to-project", "alice"]).exit_code == 2  # no project given


def test_users_lists_roles_projects_and_working_tokens(cli: Cli) -> None:
    cli.raw(["admin", "create-token", "bob"])
    cli.raw(["admin", "revoke", "alice"])
    result = cli.raw(["admin", "users"])
    assert result.exit_code == 0, result.stderr
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if "│" in line}
    # ROLE, PROJECTS, UNIX USER (the account its jobs run as), MAX PENDING, MAX RUNNING,
    # MAX GPUS (-: no limit), ACTIVE TOKENS
    default = "10,000 (default)"
    assert [c.strip() for c in rows["admin"].split("│")[2:9]] == [
        "admin", "default", "admin", default, "-", "-", "1"
    ]  # fmt: skip
    assert [c.strip() for c in rows["alice"].split("│")[2:9]] == [
        "user", "ml", "alice", default, "-", "-", "0"
    ]  # fmt: skip
    assert [c.strip() for c in rows["bob"].split("│")[2:9]] == [
        "user", "cv", "bob", default, "-", "-", "2"
    ]  # fmt: skip


def test_admin_changes_are_in_the_audit_trail(cli: Cli) -> None:
    assert cli.raw(["admin", "create-user", "carol", "-p", "ml"]).exit_code == 0
    assert cli.raw(["admin", "create-token", "carol", "--label", "laptop"]).exit_code == 0
    assert cli.raw(["admin", "add-to-project", "alice", "-p", "cv"]).exit_code == 0
    assert cli.raw(["admin", "add-to-project", "alice", "-p", "cv"]).exit_code == 0  # no change
    assert cli.raw(["admin", "revoke", "bob"]).exit_code == 0
    assert cli("quota", "ml", "--gpus", "4", user="admin").exit_code == 0

    result = cli("audit", "--json", user="admin")
    assert result.exit_code == 0, result.stderr
    # The test harness's own users (created with actor "test") come before these.
    events = [e for e in json.loads(result.stdout)["items"] if e["actor"] != "test"]
    assert [(e["action"], e["target"], e["info"]) for e in events] == [
        ("project.update", "ml", {"gpu_quota": {"from": 0, "to": 4}}),
        ("token.revoke", "bob", {"tokens": 1}),
        ("user.add_to_project", "alice", {"projects": {"from": ["ml"], "to": ["cv", "ml"]}}),
        ("token.create", "carol", {"label": "laptop"}),
        ("user.create", "carol", {"projects": ["ml"], "admin": False, "unix_user": "carol"}),
    ]
    # The database-side commands name the OS user and host; API changes the API user.
    assert events[0]["actor"] == "admin"
    assert all(e["actor"].endswith(" (gpusched admin)") and "@" in e["actor"] for e in events[1:])

    table = cli("audit", "alice", user="admin")
    assert table.exit_code == 0, table.stderr
    assert "user.add_to_project" in table.stdout and "projects ml -> cv,ml" in table.stdout
    assert "project.update" not in table.stdout  # only changes to alice
    assert "gpu_quota 0 -> 4" in cli("audit", "--action", "project.update", user="admin").stdout
    denied = cli("audit", user="alice")
    assert denied.exit_code == 1 and "admin role required" in denied.stderr


def test_set_role_makes_an_admin_and_keeps_the_last_one(cli: Cli) -> None:
    def drain_as_alice() -> str:
        return cli.raw(["drain", "n1", "--url", cli.url, "--token", cli.tokens["alice"]]).stderr

    assert "admin role required" in drain_as_alice()
    made = cli.raw(["admin", "set-role", "alice", "admin"])
    assert made.exit_code == 0 and made.stdout.strip() == "'alice' is now an admin"
    assert "no node named 'n1'" in drain_as_alice()  # past the role check
    again = cli.raw(["admin", "set-role", "alice", "admin"])
    assert again.stdout.strip() == "'alice' was already an admin"

    assert cli.raw(["admin", "set-role", "admin", "user"]).exit_code == 0
    last = cli.raw(["admin", "set-role", "alice", "user"])
    assert last.exit_code == 1 and "last admin" in last.stderr
    assert cli.raw(["admin", "set-role", "nobody", "user"]).exit_code == 1
    assert cli.raw(["admin", "set-role", "alice", "root"]).exit_code == 2  # not a role


def test_node_key_prints_the_key_the_scheduler_checks_that_node_with(cli: Cli) -> None:
    from app.nodes.keys import NodeKeys

    result = cli.raw(["admin", "node-key", "gpu-7"])
    assert result.exit_code == 0, result.stderr
    assert bytes.fromhex(result.stdout.strip()) == NodeKeys(cli.factory)("gpu-7")
    assert cli.raw(["admin", "node-key", "gpu-7"]).stdout == result.stdout  # the same each time
    assert cli.raw(["admin", "node-key", "gpu-8"]).stdout != result.stdout  # each node its own
    empty = cli.raw(["admin", "node-key", ""])
    assert empty.exit_code == 2 and "node name" in empty.stderr


def test_a_users_jobs_run_as_the_unix_account_it_is_mapped_to(cli: Cli) -> None:
    made = cli.raw(["admin", "create-user", "erin", "-p", "ml", "--unix-user", "erin_l"])
    assert made.exit_code == 0, made.stderr
    assert "its jobs run as Unix account 'erin_l'" in made.stderr
    default = cli.raw(["admin", "create-user", "fred", "-p", "ml"])
    assert "its jobs run as Unix account 'fred'" in default.stderr

    changed = cli.raw(["admin", "set-unix-user", "fred", "fred.k"])
    assert changed.exit_code == 0, changed.stderr
    assert changed.stdout.strip() == "'fred''s jobs now run as Unix account 'fred.k'"
    listed = cli.raw(["admin", "users"]).stdout
    assert "erin_l" in listed and "fred.k" in listed

    for bad in (["create-user", "gil", "-p", "ml", "--unix-user", "-rf"],
                ["set-unix-user", "fred", "a b"], ["set-unix-user", "fred", "x" * 65]):  # fmt: skip
        refused = cli.raw(["admin", *bad])
        assert refused.exit_code == 2, refused.output
        assert "--unix-user" in refused.stderr and "not a Unix account name" in refused.stderr
    missing = cli.raw(["admin", "set-unix-user", "nobody", "x"])
    assert missing.exit_code == 1 and "nobody" in missing.stderr


def test_admin_limits_sets_how_many_jobs_a_user_may_have_pending(cli: Cli) -> None:
    raised = cli.raw(["admin", "limits", "alice", "--max-pending", "20,000"])
    assert raised.exit_code == 0, raised.stderr
    assert raised.stdout.strip() == "'alice' may have at most 20,000 jobs pending"
    listed = cli.raw(["admin", "users"]).stdout
    assert "20,000" in listed and "10,000 (default)" in listed  # alice's; the others'
    back = cli.raw(["admin", "limits", "alice", "--max-pending", "default"])
    assert back.stdout.strip() == "'alice' may have at most 10,000 (the default) jobs pending"
    bad = cli.raw(["admin", "limits", "alice", "--max-pending", "lots"])
    assert bad.exit_code == 2 and "--max-pending: expected a count" in bad.stderr
    missing = cli.raw(["admin", "limits", "nobody", "--max-pending", "5"])
    assert missing.exit_code == 1 and "nobody" in missing.stderr


def test_quota_max_pending_caps_a_projects_pending_jobs(cli: Cli) -> None:
    capped = cli("quota", "ml", "--max-pending", "1", user="admin")
    assert capped.exit_code == 0, capped.stderr
    assert "jobs pending of at most 1)" in capped.stdout
    assert cli("submit", "--", "true").exit_code == 0
    refused = cli("submit", "--", "true")
    assert refused.exit_code == 1
    assert "project ml may have at most 1 jobs pending and has 1" in " ".join(
        refused.stderr.split()
    )
    cleared = cli("quota", "ml", "--max-pending", "none", user="admin")
    assert "of at most" not in cleared.stdout
    assert cli("submit", "--", "true").exit_code == 0


def test_admin_limits_sets_how_many_jobs_a_user_may_run_and_gpus_use(cli: Cli) -> None:
    set_ = cli.raw(["admin", "limits", "alice", "--max-running", "2", "--max-gpus", "1,000"])
    assert set_.exit_code == 0, set_.stderr
    assert set_.stdout.splitlines() == [
        "'alice' may run at most 2 jobs at once",
        "'alice''s running jobs may use at most 1,000 GPUs",
    ]
    rows = {
        line.split("│")[1].strip(): line
        for line in cli.raw(["admin", "users"]).stdout.splitlines()
        if "│" in line
    }
    # MAX PENDING, MAX RUNNING, MAX GPUS
    assert [c.strip() for c in rows["alice"].split("│")[5:8]] == ["10,000 (default)", "2", "1,000"]
    cleared = cli.raw(["admin", "limits", "alice", "--max-running", "none"])
    assert cleared.stdout.strip() == "'alice' may run any number of jobs at once"
    rows = {
        line.split("│")[1].strip(): line
        for line in cli.raw(["admin", "users"]).stdout.splitlines()
        if "│" in line
    }
    assert [c.strip() for c in rows["alice"].split("│")[6:8]] == ["-", "1,000"]
    for option in ("--max-running", "--max-gpus"):
        bad = cli.raw(["admin", "limits", "alice", option, "-1"])
        assert bad.exit_code == 2 and f"{option}: expected a count" in bad.stderr
    nothing = cli.raw(["admin", "limits", "alice"])
    assert nothing.exit_code == 2 and "--max-running" in nothing.stderr
    missing = cli.raw(["admin", "limits", "nobody", "--max-gpus", "5"])
    assert missing.exit_code == 1 and "nobody" in missing.stderr


def test_quota_max_running_and_max_gpus_limit_a_projects_running_jobs(cli: Cli) -> None:
    capped = cli("quota", "ml", "--max-running", "3", "--max-gpus", "4", user="admin")
    assert capped.exit_code == 0, capped.stderr
    out = " ".join(capped.stdout.split())
    assert ", at most 3 jobs running at once (" in out and "GPUs in use of at most 4," in out
    shown = json.loads(cli("quota", "ml", "--weight", "1", "--json", user="admin").stdout)
    assert (shown["max_running_jobs"], shown["max_gpus"]) == (3, 4)
    cleared = cli("quota", "ml", "--max-running", "none", "--max-gpus", "none", user="admin")
    assert "at most" not in cleared.stdout
    bad = cli("quota", "ml", "--max-gpus", "-2", user="admin")
    assert bad.exit_code == 2 and "--max-gpus: expected a count" in bad.stderr
    refused = cli("quota", "ml", "--max-running", "1")  # alice is not an admin
    assert refused.exit_code != 0


def test_admin_from_another_directory_names_the_database_and_how_to_choose(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run where no database is (the SQLite default is relative to the current directory):
    it says which file it looked for and how to point at the right one, and makes none."""
    monkeypatch.chdir(tmp_path)
    result = cli.raw(["admin", "users"], GPUSCHED_DATABASE_URL=None, GPUSCHED_DATA_DIR=None)
    assert result.exit_code == 2
    missing = tmp_path / ".gpusched" / "gpusched.db"
    assert result.stderr == (
        f"error: no database at {missing} (the SQLite file in the data dir .gpusched, relative"
        f" to {tmp_path}); run the command where `gpusched up` or `gpusched server` runs, or"
        " point at the database with GPUSCHED_DATA_DIR=DIR (its gpusched.db) or"
        " GPUSCHED_DATABASE_URL=URL\n"
    )
    assert not missing.exists()
    # Pointed at it, it works from there.
    assert cli.raw(["admin", "users"]).exit_code == 0


def test_the_cli_finds_server_and_token_in_the_config_dir(cli: Cli) -> None:
    """Neither --url nor --token nor GPUSCHED_*: `gpusched up` saved them for the CLI."""
    folder = cli.settings.data_dir.parent / "xdg-config" / "gpusched"
    folder.mkdir(parents=True)
    (folder / "url").write_text(cli.url + "\n")
    (folder / "token").write_text(cli.tokens["alice"] + "\n")
    result = cli.raw(["me", "--json"], GPUSCHED_DATA_DIR="/nonexistent")
    assert result.exit_code == 0, result.output
    assert '"name": "alice"' in result.stdout
