"""`gpusched admin ...`: user and token administration with direct database access.

These commands use the server's settings (GPUSCHED_DATABASE_URL / the data dir), not the
REST API, so they work before any admin token exists.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from app.audit.service import local_actor
from app.auth.service import (
    UserExists,
    change_membership,
    check_unix_user,
    find_user,
    issue_token,
    list_users,
    revoke_tokens,
    set_admin,
    set_max_gpus,
    set_max_pending_jobs,
    set_max_running_jobs,
    set_unix_user,
)
from app.auth.service import create_user as create
from app.cli.client import (
    EXIT_REJECTED,
    EXIT_USAGE,
    CliError,
    add_row,
    console,
    count_or_none,
    make_table,
)
from app.cli.process_setup import load_settings_or_exit
from app.cli.server import database, session_scope
from app.db import make_session_factory, utcnow
from app.errors import FieldError
from app.nodes.keys import installation_secret, node_key
from app.text import check_name

admin_app = typer.Typer(
    help="Users, their projects and tokens (direct database access: the database of "
    "GPUSCHED_DATABASE_URL, else gpusched.db in GPUSCHED_DATA_DIR, default ./.gpusched; run "
    "where `gpusched up` or the server runs).",
    no_args_is_help=True,
)

UserName = Annotated[str, typer.Argument(help="User name", show_default=False)]


def _check_name(value: str, what: str) -> str:
    value = value.strip()
    if not value or len(value) > 64:
        raise CliError(f"{what} {value!r}: must be 1 to 64 characters", EXIT_USAGE)
    try:
        return check_name(value)
    except ValueError as exc:
        raise CliError(f"{what} {value!r}: {exc}", EXIT_USAGE) from None


def _actor() -> str:
    return local_actor("gpusched admin")


def _print_token(intro: str, token: str) -> None:
    # The explanation goes to stderr so `TOKEN=$(gpusched admin ...)` captures only the token.
    typer.echo(f"{intro}\nAPI token (shown only this once):", err=True)
    typer.echo(token)


@admin_app.command("create-user")
def create_user(
    name: UserName,
    project: Annotated[
        list[str],
        typer.Option(
            "--project", "-p", help="Project (created when missing); repeatable", show_default=False
        ),
    ],
    admin: Annotated[bool, typer.Option("--admin", help="Give the user the admin role")] = False,
    unix_user: Annotated[
        str | None,
        typer.Option(
            "--unix-user",
            help="The Unix account the user's jobs run as on the nodes (default: the name)",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Create a user in one or more projects and print its first token."""
    name = _check_name(name, "user name")
    projects = list(dict.fromkeys(_check_name(p, "project") for p in project))
    if unix_user is not None:
        _check_unix_user(unix_user)
    settings = load_settings_or_exit()
    try:
        with session_scope(settings) as session:
            _, token = create(
                session=session,
                name=name,
                projects=projects,
                is_admin=admin,
                ttl_days=settings.token_ttl_days,
                actor=_actor(),
                unix_user=unix_user,
            )
    except UserExists as exc:
        raise CliError(str(exc), EXIT_REJECTED) from None
    role = "admin" if admin else "user"
    _print_token(
        f"created {role} {name!r} in project(s) {', '.join(projects)}; "
        f"its jobs run as Unix account {unix_user or name!r}",
        token,
    )


def _check_unix_user(value: str) -> str:
    try:
        return check_unix_user(value)
    except FieldError as exc:
        raise CliError(f"--unix-user: {exc}", EXIT_USAGE) from None


@admin_app.command("set-unix-user")
def set_unix_user_command(
    name: UserName,
    account: Annotated[str, typer.Argument(help="Unix account name", show_default=False)],
) -> None:
    """Set the Unix account a user's jobs run as on the nodes (jobs already running keep
    theirs)."""
    _check_unix_user(account)
    settings = load_settings_or_exit()
    try:
        with session_scope(settings) as session:
            changed = set_unix_user(
                session=session, user_name=name, unix_user=account, actor=_actor()
            )
    except LookupError as exc:
        raise CliError(str(exc.args[0]), EXIT_REJECTED) from None
    typer.echo(f"{name!r}'s jobs {'now' if changed else 'already'} run as Unix account {account!r}")


@admin_app.command("limits")
def limits_command(
    name: UserName,
    max_pending: Annotated[
        str | None,
        typer.Option(
            "--max-pending",
            help="Jobs (array tasks each) the user may have pending, as Slurm's "
            "MaxSubmitJobs, or default (GPUSCHED_MAX_PENDING_JOBS_PER_USER)",
            show_default=False,
        ),
    ] = None,
    max_running: Annotated[
        str | None,
        typer.Option(
            "--max-running",
            help="Jobs the user may run at once, as Slurm's MaxJobs (more wait), or none "
            "(no limit)",
            show_default=False,
        ),
    ] = None,
    max_gpus: Annotated[
        str | None,
        typer.Option(
            "--max-gpus",
            help="GPUs the user's running jobs may use, as Slurm's MaxTRES=gres/gpu (more "
            "wait), or none (no limit)",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Set how many jobs a user may have pending (jobs already pending stay), run at once
    and how many GPUs they may use (running jobs go on; the next ones wait)."""
    if max_pending is None and max_running is None and max_gpus is None:
        raise CliError("give --max-pending, --max-running, --max-gpus or several", EXIT_USAGE)
    pending = (
        None if max_pending is None else count_or_none(max_pending, "--max-pending", none_word="default")
    )  # fmt: skip
    running = None if max_running is None else count_or_none(max_running, "--max-running")
    gpus = None if max_gpus is None else count_or_none(max_gpus, "--max-gpus")
    settings = load_settings_or_exit()
    try:
        with session_scope(settings) as session:
            if max_pending is not None:
                set_max_pending_jobs(session=session, user_name=name, limit=pending, actor=_actor())
            if max_running is not None:
                set_max_running_jobs(session=session, user_name=name, limit=running, actor=_actor())
            if max_gpus is not None:
                set_max_gpus(session=session, user_name=name, limit=gpus, actor=_actor())
    except LookupError as exc:
        raise CliError(str(exc.args[0]), EXIT_REJECTED) from None
    if max_pending is not None:
        default = f"{settings.max_pending_jobs_per_user:,} (the default)"
        most = default if pending is None else f"{pending:,}"
        typer.echo(f"{name!r} may have at most {most} jobs pending")
    if max_running is not None:
        most = "any number of" if running is None else f"at most {running:,}"
        typer.echo(f"{name!r} may run {most} jobs at once")
    if max_gpus is not None:
        most = "any number of" if gpus is None else f"at most {gpus:,}"
        typer.echo(f"{name!r}'s running jobs may use {most} GPUs")


@admin_app.command("create-token")
def create_token(
    name: UserName,
    label: Annotated[str, typer.Option(help="A note stored with the token")] = "cli",
) -> None:
    """Issue another token for an existing user and print it."""
    settings = load_settings_or_exit()
    with session_scope(settings) as session:
        try:
            user = find_user(session=session, name=name)
        except LookupError as exc:
            raise CliError(str(exc.args[0]), EXIT_REJECTED) from None
        token = issue_token(
            session=session,
            user=user,
            ttl_days=settings.token_ttl_days,
            label=label[:64],
            actor=_actor(),
        )
    _print_token(f"new token for {name!r}", token)


ProjectOption = Annotated[
    list[str],
    typer.Option("--project", "-p", help="Project; repeatable", show_default=False),
]


def _change_membership(name: str, project: list[str], *, member: bool) -> list[str]:
    projects = list(dict.fromkeys(_check_name(p, "project") for p in project))
    settings = load_settings_or_exit()
    try:
        with session_scope(settings) as session:
            return change_membership(
                session=session, user_name=name, projects=projects, member=member, actor=_actor()
            )
    except (LookupError, ValueError) as exc:
        raise CliError(str(exc.args[0]), EXIT_REJECTED) from None


@admin_app.command("add-to-project")
def add_to_project(name: UserName, project: ProjectOption) -> None:
    """Add a user to projects (created when missing); API processes see it within the cache time."""
    now_in = _change_membership(name, project, member=True)
    typer.echo(f"{name!r} is now in project(s) {', '.join(now_in)}")


@admin_app.command("remove-from-project")
def remove_from_project(name: UserName, project: ProjectOption) -> None:
    """Remove a user from projects; the jobs it submitted there stay (cancel them if need be)."""
    now_in = _change_membership(name, project, member=False)
    typer.echo(f"{name!r} is now in project(s) {', '.join(now_in)}")


@admin_app.command("users")
def users() -> None:
    """List users: role, projects, the Unix account their jobs run as, their limits (-: none)
    and how many tokens still work."""
    settings = load_settings_or_exit()
    table = make_table(
        "USER", "ROLE", "PROJECTS", "UNIX USER", "MAX PENDING", "MAX RUNNING", "MAX GPUS",
        "ACTIVE TOKENS",
    )  # fmt: skip
    default = f"{settings.max_pending_jobs_per_user:,} (default)"
    with session_scope(settings) as session:
        for user in list_users(session=session, now=utcnow()):
            role = "admin" if user.is_admin else "user"
            projects = ", ".join(user.projects)
            most = default if user.max_pending_jobs is None else f"{user.max_pending_jobs:,}"
            running = "-" if user.max_running_jobs is None else f"{user.max_running_jobs:,}"
            gpus = "-" if user.max_gpus is None else f"{user.max_gpus:,}"
            add_row(
                table, user.name, role, projects, user.unix_user, most, running, gpus,
                user.active_tokens,
            )  # fmt: skip
    console().print(table)


class Role(StrEnum):
    admin = "admin"
    user = "user"


@admin_app.command("set-role")
def set_role(
    name: UserName,
    role: Annotated[Role, typer.Argument(help="admin or user", show_default=False)],
) -> None:
    """Make a user an admin or a plain user (as sacctmgr modify user ... set adminlevel=);
    the last admin stays one."""
    settings = load_settings_or_exit()
    try:
        with session_scope(settings) as session:
            changed = set_admin(
                session=session, user_name=name, is_admin=role is Role.admin, actor=_actor()
            )
    except (LookupError, ValueError) as exc:
        raise CliError(str(exc.args[0]), EXIT_REJECTED) from None
    what = "an admin" if role is Role.admin else "a plain user"
    typer.echo(f"{name!r} {'is now' if changed else 'was already'} {what}")


@admin_app.command("revoke")
def revoke(name: UserName) -> None:
    """Revoke every token of a user (other API processes notice within the token cache time)."""
    settings = load_settings_or_exit()
    try:
        with session_scope(settings) as session:
            count = revoke_tokens(session=session, user_name=name, actor=_actor())
    except LookupError as exc:
        raise CliError(str(exc.args[0]), EXIT_REJECTED) from None
    typer.echo(f"revoked {count} token(s) of {name!r}")


@admin_app.command("node-key")
def print_node_key(
    name: Annotated[str, typer.Argument(help="Node name (its agent's --name)", show_default=False)],
) -> None:
    """Print the key node NAME's agent signs its reports and checks its orders with.

    Store it where only the agent's user can read it (chmod 600) and point the agent at
    it with GPUSCHED_AGENT_KEY_FILE (default: <data dir>/agents/NAME/node.key). It is
    derived from this installation's secret: the same NAME always gets the same key."""
    if not 1 <= len(name) <= 128:
        raise CliError(f"node name {name!r}: must be 1 to 128 characters", EXIT_USAGE)
    settings = load_settings_or_exit()
    with database(settings, existing=True) as engine:
        secret = installation_secret(make_session_factory(engine))
    typer.echo(node_key(secret, name).hex())


def register(app: typer.Typer) -> None:
    app.add_typer(admin_app, name="admin", rich_help_panel="Administration")
