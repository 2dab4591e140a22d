"""`gpusched server` start-up (migrate, bootstrap admin, settings errors) and `migrate`."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

import app.cli.server as server_module
import app.migrate as migrate_module
from app.audit.service import list_events
from app.auth.service import load_principal
from app.cli import app as cli_app
from app.config import Settings
from app.db import utcnow

runner = CliRunner()

CLEAN_ENV: dict[str, str | None] = {
    "GPUSCHED_URL": None,
    "GPUSCHED_TOKEN": None,
    "GPUSCHED_HOST": None,
    "GPUSCHED_PORT": None,
    "GPUSCHED_REDIS_URL": None,
    "GPUSCHED_TOKEN_TTL_DAYS": None,
}


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[Settings]:
    """Replace uvicorn with a recorder: these tests stop where serving would begin."""
    calls: list[Settings] = []
    monkeypatch.setattr(
        server_module, "serve", lambda settings, factory, log_level: calls.append(settings)
    )
    return calls


def test_unusable_port_setting_exits_2_naming_the_variable(
    served: list[Settings], tmp_path: Path
) -> None:
    env = {**CLEAN_ENV, "GPUSCHED_PORT": "notaport", "GPUSCHED_DATA_DIR": str(tmp_path / "d")}
    result = runner.invoke(cli_app, ["server"], env=env)
    assert result.exit_code == 2
    assert "GPUSCHED_PORT" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output
    assert not served


def test_unreachable_database_exits_2(served: list[Settings], tmp_path: Path) -> None:
    env = {
        **CLEAN_ENV,
        "GPUSCHED_DATA_DIR": str(tmp_path / "d"),
        # Port 1 on loopback: nothing listens, the connection is refused at once.
        "GPUSCHED_DATABASE_URL": "postgresql+psycopg://gpusched:secret@127.0.0.1:1/gpusched",
    }
    result = runner.invoke(cli_app, ["server"], env=env)
    assert result.exit_code == 2
    assert "cannot use the database at postgresql+psycopg://gpusched:***@127.0.0.1:1" in (
        result.stderr
    )
    assert "secret" not in result.output and "Traceback" not in result.output
    assert not served


def test_first_start_creates_admin_token_file_0600_and_prints_it_once(
    served: list[Settings],
    tmp_path: Path,
    database_url: str,
    session_factory: sessionmaker[Session],
) -> None:
    data_dir = tmp_path / "new" / "data"
    env = {
        **CLEAN_ENV,
        "GPUSCHED_DATA_DIR": str(data_dir),
        "GPUSCHED_DATABASE_URL": database_url,  # emptied by session_factory
        "GPUSCHED_PORT": "8123",
    }
    result = runner.invoke(cli_app, ["server"], env=env)
    assert result.exit_code == 0, result.output
    assert len(served) == 1 and served[0].port == 8123

    token_file = data_dir / "admin.token"
    token = token_file.read_text().strip()
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert result.stdout.count(token) == 1
    with session_factory() as session:
        principal = load_principal(session=session, token=token, now=utcnow())
    assert principal is not None and principal.name == "admin" and principal.is_admin
    with session_factory() as session:
        (created,) = list_events(session=session, limit=10).items
    # Who created the first admin is on record, like every later user.
    assert (created.action, created.target) == ("user.create", "admin")
    assert created.actor.endswith(" (first start)") and "@" in created.actor

    # Second start: the database is not empty, nothing is printed or rewritten.
    again = runner.invoke(cli_app, ["server", "--port", "8124"], env=env)
    assert again.exit_code == 0, again.output
    assert token not in again.stdout and "admin" not in again.stdout
    assert token_file.read_text().strip() == token
    assert served[1].port == 8124


def test_migrate(tmp_path: Path) -> None:
    data_dir = tmp_path / "m"
    env = {**CLEAN_ENV, "GPUSCHED_DATA_DIR": str(data_dir), "GPUSCHED_DATABASE_URL": None}
    result = runner.invoke(cli_app, ["migrate"], env=env)
    assert result.exit_code == 0, result.output
    assert "is at revision" in result.stdout
    assert (data_dir / "gpusched.db").exists()
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700

    bad = runner.invoke(cli_app, ["migrate", "nosuchrevision"], env=env)
    assert bad.exit_code == 2 and "migration failed" in bad.stderr


def test_an_install_without_migrations_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, served: list[Settings]
) -> None:
    # What a plain `pip install .` looks like: the app package without migrations/ beside it
    # (the server used to die with a traceback, `migrate` with alembic's "use the 'init'
    # command").
    monkeypatch.setattr(migrate_module, "ROOT", tmp_path / "site-packages")
    env = {**CLEAN_ENV, "GPUSCHED_DATA_DIR": str(tmp_path / "d"), "GPUSCHED_DATABASE_URL": None}
    for command in ("migrate", "server"):
        result = runner.invoke(cli_app, [command], env=env)
        assert result.exit_code == 2, result.output
        assert "no migrations/ directory" in result.stderr
        assert "pip install -e ." in result.stderr
    assert served == []


def test_migrate_makes_a_private_database_and_says_the_installation_id(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    env = {**CLEAN_ENV, "GPUSCHED_DATA_DIR": str(data_dir)}  # the SQLite file, in it
    result = runner.invoke(cli_app, ["migrate"], env=env)
    assert result.exit_code == 0, result.output
    database = data_dir / "gpusched.db"
    assert stat.S_IMODE(database.stat().st_mode) == 0o600
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    [line] = [line for line in result.stdout.splitlines() if line.startswith("installation id: ")]
    again = runner.invoke(cli_app, ["migrate"], env=env)
    assert line in again.stdout  # kept in the database: the same on every start
    assert len(line.split()[-1]) == 32
