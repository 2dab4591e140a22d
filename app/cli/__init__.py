"""The `gpusched` command line.

Each command module exposes `register(app)`, which adds its commands (or a sub-app) to the
root Typer app; adding a module is one import and one `register` line below. Commands raise
`app.cli.client.CliError` for expected failures; the root group prints its message to
stderr and exits with its code, so no traceback reaches the user.
"""

from __future__ import annotations

from importlib import metadata
from typing import Annotated, Any

import typer
from sqlalchemy.exc import DBAPIError
from typer.core import TyperGroup, TyperOption

from app.cli import (
    admin,
    batch,
    cluster,
    jobs,
    logs,
    me,
    reports,
    server,
    simulate,
    up,
    windows,
    workers,
)
from app.cli.client import EXIT_USAGE, CliError, set_utc_output
from app.config import SettingsError


def _fail(message: str, code: int) -> typer.Exit:
    for line in message.splitlines() or [""]:
        typer.echo(f"error: {line}", err=True)
    return typer.Exit(code)


class _Group(TyperGroup):
    """The root group: every expected failure of every subcommand ends here as one message."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except CliError as exc:
            raise _fail(exc.message, exc.exit_code) from None
        except SettingsError as exc:
            raise _fail(str(exc), EXIT_USAGE) from None
        except DBAPIError as exc:
            # Safety net; commands that use the database give a more specific message.
            raise _fail(f"database error: {str(exc.orig).strip()}", EXIT_USAGE) from None


app = typer.Typer(
    name="gpusched",
    cls=_Group,
    help="GPU cluster scheduler: run the server, submit and inspect jobs, manage the cluster.",
    no_args_is_help=True,
    add_completion=False,
    # Joins a docstring's wrapped lines in the command list (the default, "rich", keeps
    # them, breaking summaries mid-sentence); `code` in help shows as code.
    rich_markup_mode="markdown",
    # Locals can hold API tokens; never print them in a traceback.
    pretty_exceptions_show_locals=False,
)

_typed = TyperOption.display_type_rich


def _no_type_for_flags(self: TyperOption, ctx: Any) -> str | None:
    """A flag takes no value: --help shows none (Typer's `<bool>` beside every flag reads as
    if one were expected)."""
    return None if self.is_flag else _typed(self, ctx)


TyperOption.display_type_rich = _no_type_for_flags  # type: ignore[method-assign]


def version() -> str:
    try:
        return metadata.version("gpusched")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed: pip install .)"


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"gpusched {version()}")
        raise typer.Exit()


@app.callback()
def _root(
    _version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print gpusched's version and exit.",
        ),
    ] = False,
    utc: Annotated[
        bool,
        typer.Option(
            "--utc",
            help="Print times in UTC (default: local time, with its zone; --json output "
            "keeps the API's ISO 8601 times).",
        ),
    ] = False,
) -> None:
    """GPU cluster scheduler: run the server, submit and inspect jobs, manage the cluster."""
    set_utc_output(utc)


server.register(app)
jobs.register(app)
logs.register(app)
me.register(app)
cluster.register(app)
windows.register(app)
admin.register(app)
up.register(app)
workers.register(app)
reports.register(app)
batch.register(app)
simulate.register(app)


def main() -> None:
    app(prog_name="gpusched")
