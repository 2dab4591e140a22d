"""`gpusched server` and `gpusched migrate`, plus the database helpers the admin commands share."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from alembic.util.exc import CommandError
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, ProgrammingError
from sqlalchemy.orm import Session, sessionmaker

from app.audit.service import local_actor
from app.auth.service import ensure_bootstrap_admin
from app.cli.client import EXIT_USAGE, CliError, write_secret
from app.cli.process_setup import ensure_data_dir, load_settings_or_exit, private_files
from app.config import Settings
from app.db import make_engine, make_session_factory, transaction
from app.installation.service import installation_id
from app.migrate import upgrade


def safe_url(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL was already rejected by Settings; be safe anyway
        return "<database URL>"


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def where_database(settings: Settings) -> str:
    """Which database the settings chose and how to choose another: for the commands that
    open it directly (`gpusched admin`), which may run in another directory than the server
    and so, by default, on another SQLite file."""
    if settings.database_url:
        chosen = "GPUSCHED_DATABASE_URL's"
    else:
        folder = settings.data_dir
        relative = "" if folder.is_absolute() else f", relative to {Path.cwd()}"
        chosen = f"the SQLite file in the data dir {folder}{relative}"
    return (
        f"({chosen}); run the command where `gpusched up` or `gpusched server` runs, or "
        "point at the database with GPUSCHED_DATA_DIR=DIR (its gpusched.db) or "
        "GPUSCHED_DATABASE_URL=URL"
    )


def _missing_sqlite_file(url: str) -> Path | None:
    parsed = make_url(url)
    name = parsed.database
    if parsed.get_backend_name() != "sqlite" or not name or name == ":memory:":
        return None
    path = Path(name)
    return None if path.exists() else path.resolve()


@contextmanager
def database(settings: Settings, *, existing: bool = False) -> Iterator[Engine]:
    """An engine for the configured database; an unreachable or unusable database becomes a
    one-line CliError (exit 2) instead of a traceback. `existing`: the database must be
    there already (no empty SQLite file is made), and a failure says which database was
    opened and how to point at another."""
    url = settings.effective_database_url
    where = f" {where_database(settings)}" if existing else ""
    if existing and (missing := _missing_sqlite_file(url)) is not None:
        raise CliError(f"no database at {missing}{where}", EXIT_USAGE)
    engine = make_engine(url)
    try:
        yield engine
    except DBAPIError as exc:
        reason = _first_line(exc)
        hint = ""
        if isinstance(exc, ProgrammingError) or "no such table" in reason:
            hint = " — has `gpusched migrate` been run?"
        raise CliError(
            f"cannot use the database at {safe_url(url)}: {reason}{hint}{where}", EXIT_USAGE
        ) from None
    finally:
        engine.dispose()


@contextmanager
def session_scope(settings: Settings) -> Iterator[Session]:
    """One transaction against the configured database, which must exist (admin
    commands)."""
    with (
        database(settings, existing=True) as engine,
        transaction(make_session_factory(engine)) as session,
    ):
        yield session


def invoking_account() -> str:
    """The Unix account that runs this command: the one that used sudo, if it did. The
    first admin's jobs run as it."""
    sudo = os.environ.get("SUDO_USER")
    if os.geteuid() == 0 and sudo and sudo != "root":
        return sudo
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def bootstrap_admin(settings: Settings, factory: sessionmaker[Session]) -> str | None:
    """On an empty database create `admin`, store its token in a 0600 file, return the token.

    The file is written before the commit: if it cannot be written no admin is created,
    and the next start tries again instead of leaving an admin nobody has a token for.
    """
    path = settings.admin_token_file
    try:
        with transaction(factory) as session:
            token = ensure_bootstrap_admin(
                session=session,
                ttl_days=settings.token_ttl_days,
                actor=local_actor("first start"),
                unix_user=invoking_account(),
            )
            if token is not None:
                try:
                    write_secret(path, token + "\n")
                except OSError as exc:
                    raise CliError(
                        f"cannot write the admin token file {path}: {exc.strerror}", EXIT_USAGE
                    ) from None
    except IntegrityError:
        # Another server replica bootstrapped the same empty database a moment earlier.
        return None
    return token


def announce_token(token: str, path: Path) -> None:
    rule = "=" * 72
    typer.echo(
        f"{rule}\n"
        "gpusched: created the bootstrap admin user 'admin'.\n"
        "Its API token is shown only this once (also saved, mode 0600, to\n"
        f"{path.resolve()}):\n\n"
        f"    {token}\n\n"
        "Use it with --token or GPUSCHED_TOKEN; create more users with\n"
        "`gpusched admin create-user NAME --project P`.\n"
        f"{rule}"
    )


def migrate_or_exit(engine: Engine, revision: str = "head") -> None:
    try:
        upgrade(engine, revision)
    except CommandError as exc:  # e.g. an unknown revision, or no migrations/ installed
        raise CliError(f"migration failed: {exc}", EXIT_USAGE) from None


def prepare_database(settings: Settings, engine: Engine) -> sessionmaker[Session]:
    """What every start does before serving (`server`, and one-command launchers like `up`):
    migrate to head, then on an empty database create the admin and show its token once."""
    migrate_or_exit(engine)
    factory = make_session_factory(engine)
    token = bootstrap_admin(settings, factory)
    if token is not None:
        announce_token(token, settings.admin_token_file)
    return factory


def serve(settings: Settings, factory: sessionmaker[Session], log_level: str) -> None:
    import uvicorn

    from app.main import create_app

    config = uvicorn.Config(
        create_app(settings, session_factory=factory),
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        # uvicorn would believe X-Forwarded-For from 127.0.0.1: the app trusts only the
        # proxies GPUSCHED_TRUSTED_PROXIES names (create_app).
        proxy_headers=False,
    )
    server = uvicorn.Server(config)
    try:
        server.run()
    except SystemExit:
        # uvicorn logs why (e.g. address in use) and exits before serving.
        if not server.started:
            raise CliError(
                f"could not serve on {settings.host}:{settings.port} (see the log above)",
                EXIT_USAGE,
            ) from None
        raise


def server(
    host: Annotated[
        str | None, typer.Option(help="Listen address (default: GPUSCHED_HOST)")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Listen port (default: GPUSCHED_PORT)")] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level")] = "info",
) -> None:
    """Migrate the database, create the admin on first start, and serve the REST API."""
    overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    settings = load_settings_or_exit(**overrides)
    private_files()
    ensure_data_dir(settings.data_dir)
    with database(settings) as engine:
        factory = prepare_database(settings, engine)
        serve(settings, factory, log_level)


def current_revision(engine: Engine) -> str:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        heads = MigrationContext.configure(connection).get_current_heads()
    return ", ".join(heads) or "none"


def migrate(
    revision: Annotated[str, typer.Argument(help="Target revision")] = "head",
) -> None:
    """Upgrade the database schema and create the first admin on an empty database
    (the server also does both on start)."""
    settings = load_settings_or_exit()
    private_files()
    ensure_data_dir(settings.data_dir)
    with database(settings) as engine:
        migrate_or_exit(engine, revision)
        typer.echo(
            f"database {safe_url(settings.effective_database_url)} is at revision "
            f"{current_revision(engine)}"
        )
        # A fresh production database (docker-compose runs only `migrate` and uvicorn)
        # needs its first admin too.
        factory = make_session_factory(engine)
        token = bootstrap_admin(settings, factory)
        if token is not None:
            announce_token(token, settings.admin_token_file)
        with transaction(factory) as session:
            # An agent on a node that cannot reach Redis's copy may be given it
            # (GPUSCHED_AGENT_INSTALLATION).
            typer.echo(f"installation id: {installation_id(session=session)}")


def register(app: typer.Typer) -> None:
    app.command("server", rich_help_panel="Service")(server)
    app.command("migrate", rich_help_panel="Service")(migrate)
