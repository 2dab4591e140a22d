"""The `gpusched` command line.

Each command module exposes `register(app)`, which adds its commands (or a sub-app) to a
Typer app; `COMMAND_MODULES` below names the module of each command. A module is imported
only when one of its commands runs (help and a mistyped command load them all): a node's
agent or `gpusched jobs` need not load the API's models, schemas and migrations, a second
of CPU in every process. Commands raise `app.cli.client.CliError` for expected failures;
the root group prints its message to stderr and exits with its code, so no traceback
reaches the user.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from importlib import metadata
from typing import Annotated, Any

import typer
from typer.core import TyperGroup, TyperOption

from app.cli.client import EXIT_USAGE, CliError, set_utc_output
from app.config import SettingsError

# The commands of each module, in the order `gpusched --help` lists them within their panels.
_COMMANDS_OF = {
    "app.cli.server": "server migrate",
    "app.cli.jobs": "submit jobs queue show cancel update wait hold release requeue",
    "app.cli.logs": "logs",
    "app.cli.me": "me",
    "app.cli.cluster": "nodes queues quota drain undrain remove-node audit",
    "app.cli.up": "up",
    "app.cli.workers": "scheduler agent",
    "app.cli.reports": "estimate seff usage",
    "app.cli.simulate": "simulate",
    # Command groups after the commands, as Typer lists them.
    "app.cli.windows": "window",
    "app.cli.admin": "admin",
    "app.cli.batch": "batch",
}
COMMAND_MODULES = {
    command: module for module, commands in _COMMANDS_OF.items() for command in commands.split()
}


def _fail(message: str, code: int) -> typer.Exit:
    for line in message.splitlines() or [""]:
        typer.echo(f"error: {line}", err=True)
    return typer.Exit(code)


def registered_commands(module: str) -> Mapping[str, Any]:
    """The commands a command module registers (Typer's Click commands)."""
    registrar = typer.Typer(rich_markup_mode="markdown")
    importlib.import_module(module).register(registrar)
    return typer.main.get_group(registrar).commands


class _Group(TyperGroup):
    """The root group: loads a command's module when the command is asked for; every
    expected failure of every subcommand ends here as one message."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMAND_MODULES)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        module = COMMAND_MODULES.get(cmd_name)
        if module is not None and cmd_name not in self.commands:
            for name, command in registered_commands(module).items():
                self.add_command(command, name)
        return super().get_command(ctx, cmd_name)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and args[0] not in COMMAND_MODULES:
            # A mistyped command: Typer suggests the nearest among those loaded, so all.
            for name in COMMAND_MODULES:
                self.get_command(ctx, name)
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except CliError as exc:
            raise _fail(exc.message, exc.exit_code) from None
        except SettingsError as exc:
            raise _fail(str(exc), EXIT_USAGE) from None
        except Exception as exc:
            # Safety net; commands that use the database give a more specific message.
            # SQLAlchemy is looked up, not imported: most commands never load it (a
            # quarter of a second of every `gpusched submit`), and then raised none.
            sqlalchemy_errors = sys.modules.get("sqlalchemy.exc")
            if sqlalchemy_errors is None or not isinstance(exc, sqlalchemy_errors.DBAPIError):
                raise
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


def main() -> None:
    app(prog_name="gpusched")
