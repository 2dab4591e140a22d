"""`gpusched --help`: each command's summary reads as one paragraph."""

from __future__ import annotations

from typer.testing import CliRunner

from app.cli import app as cli_app


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
