"""`gpusched me`: who the token belongs to, and their own settings."""

from __future__ import annotations

from typing import Annotated

import typer

from app.cli.client import (
    EXIT_USAGE,
    ApiClient,
    CliError,
    JsonOption,
    TokenOption,
    UrlOption,
    print_json,
)


def me(
    notify: Annotated[
        str | None,
        typer.Option(
            "--notify",
            help="Set your default notification URL: a job submitted with --notify-on and no "
            "--notify of its own posts there (as Slurm mails the submitting user)",
        ),
    ] = None,
    no_notify: Annotated[
        bool, typer.Option("--no-notify", help="Clear your default notification URL")
    ] = False,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Who the token belongs to (role, projects, default notification URL); --notify URL
    or --no-notify changes that default."""
    if notify is not None and no_notify:
        raise CliError("give --notify URL or --no-notify, not both", EXIT_USAGE)
    client = ApiClient.from_options(url, token)
    if notify is not None or no_notify:
        who = client.patch("/api/v1/me", json={"notify_url": notify})
    else:
        who = client.get("/api/v1/me")
    if as_json:
        print_json(who)
        return
    role = "admin" if who["is_admin"] else "user"
    typer.echo(f"{who['name']} ({role}) in project(s) {', '.join(who['projects']) or 'none'}")
    typer.echo(f"notifications: {who.get('notify_url') or 'no default URL'}")


def register(app: typer.Typer) -> None:
    app.command("me", rich_help_panel="Jobs")(me)
