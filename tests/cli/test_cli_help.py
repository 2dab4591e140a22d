"""`gpusched --help`: each command's summary reads as one paragraph, flags without a type;
`gpusched --version`; commands' modules loaded only when used."""

from __future__ import annotations

import ast
import subprocess
import sys
import types
from importlib import metadata

import pytest
import typer
from typer.testing import CliRunner

from app.cli import COMMAND_MODULES, registered_commands
from app.cli import app as cli_app
from app.config import SettingsError, load_settings


def test_the_command_list_joins_each_summary_into_one_paragraph() -> None:
    # Docstrings wrap at 100 columns; the list must not keep those breaks mid-sentence
    # ("as `sacctmgr list" / "transactions`)"), which Typer's default markup mode did.
    result = CliRunner().invoke(cli_app, ["--help"], env={"COLUMNS": "250"}, terminal_width=250)
    assert result.exit_code == 0, result.output
    lines = {line.split()[1]: line for line in result.output.splitlines() if "│ " in line[:3]}
    assert "newest first (as sacctmgr list transactions)." in lines["audit"]
    assert "with the estimated start and why each waits (as squeue --start)." in lines["queue"]
    # Still in their panels.
    assert "╭─ Jobs " in result.output and "╭─ Cluster " in result.output


def test_version_prints_the_installed_version() -> None:
    result = CliRunner().invoke(cli_app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"gpusched {metadata.version('gpusched')}\n"


@pytest.mark.parametrize("command", [[], ["jobs"], ["submit"], ["scheduler"], ["up"]])
def test_flags_show_no_type_in_help(command: list[str]) -> None:
    """A flag takes no value: no `<bool>` beside it; options that take one keep theirs."""
    result = CliRunner().invoke(
        cli_app, [*command, "--help"], env={"COLUMNS": "250"}, terminal_width=250
    )
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output
    help_line = next(line for line in result.output.splitlines() if "--help" in line)
    assert "<" not in help_line
    if command == ["jobs"]:
        assert "<int>" in result.output or "<text>" in result.output or "<str>" in result.output


def test_each_command_is_named_with_the_module_that_registers_it() -> None:
    """The root loads a command's module only when the command runs: the names it lists
    must be exactly those its modules register."""
    registered = {
        name: module
        for module in dict.fromkeys(COMMAND_MODULES.values())
        for name in registered_commands(module)
    }
    assert registered == COMMAND_MODULES


def test_a_node_agent_loads_neither_the_api_nor_the_database_models() -> None:
    """`gpusched agent` runs on every node: it loads the command modules it needs, not the
    API's models, schemas and migrations (a second of CPU at each start)."""
    code = (
        "import sys; from app.cli import app; from typer.testing import CliRunner; "
        "CliRunner().invoke(app, ['agent', '--help']); "
        "print(sorted(m for m in sys.modules if m.startswith(('app.', 'alembic', 'fastapi'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    loaded = set(ast.literal_eval(out))
    assert "app.cli.workers" in loaded
    assert not loaded & {"app.cli.server", "app.cli.admin", "app.main", "app.jobs.models"}
    assert not {m for m in loaded if m.startswith(("alembic", "fastapi"))}


@pytest.mark.parametrize("command", ["submit", "jobs", "simulate"])
def test_a_client_command_loads_neither_sqlalchemy_nor_the_api_schemas(command: str) -> None:
    """`gpusched submit` from a script or cron talks to the API: SQLAlchemy and the API's
    pydantic schemas were a third of a second of its start (half of it)."""
    code = (
        "import sys; from app.cli import app; from typer.testing import CliRunner; "
        f"CliRunner().invoke(app, ['{command}', '--help']); "
        "print(sorted(m for m in sys.modules if m.startswith(('app.', 'sqlalchemy'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    loaded = set(ast.literal_eval(out))
    assert COMMAND_MODULES[command] in loaded
    assert not {m for m in loaded if m.startswith("sqlalchemy")}
    assert "app.jobs.schemas" not in loaded


def test_a_database_url_is_still_checked_when_given() -> None:
    with pytest.raises(SettingsError, match="only sqlite:// and postgresql:// URLs"):
        load_settings(database_url="mysql://db/jobs")
    with pytest.raises(SettingsError, match="not a database URL"):
        load_settings(database_url="no url at all")
    assert load_settings(database_url="postgresql://db/jobs").database_url


def test_a_database_error_from_any_command_is_one_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The root's safety net, for a command that lets one through: no traceback."""
    from sqlalchemy.exc import OperationalError

    def register(registrar: typer.Typer) -> None:
        @registrar.command("fails-with-the-database")
        def fails() -> None:
            raise OperationalError("SELECT 1", {}, Exception("server closed the connection"))

    module = types.ModuleType("failing_command")
    module.register = register  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "failing_command", module)
    monkeypatch.setitem(COMMAND_MODULES, "fails-with-the-database", "failing_command")
    result = CliRunner().invoke(cli_app, ["fails-with-the-database"])
    assert result.exit_code == 2
    assert result.output == "error: database error: server closed the connection\n"


def test_a_mistyped_command_is_answered_with_the_nearest_one() -> None:
    result = CliRunner().invoke(cli_app, ["jbos"])
    assert result.exit_code == 2
    assert "No such command 'jbos'. Did you mean 'jobs'?" in result.output
