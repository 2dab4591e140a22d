"""Shared fixtures, and the markers that split the suite between its passes.

The database under test is chosen by GPUSCHED_TEST_DB: "sqlite" (default) or "postgresql".
PostgreSQL is the server GPUSCHED_TEST_PG_URL names, else a private one the run starts
itself (tests/support/servers.py); each test session (each xdist worker) gets its own
database, created here and dropped at the end, so parallel runs never collide.

Markers, given here from what a test uses:
- `db`: the test touches a database (its fixtures reach `database_url`, or it drives a
  stack of processes); `make test` runs these on both backends, the rest once.
- `postgresql`: the test needs PostgreSQL whatever the backend (the fault tests stop and
  start a server of their own); it runs in the PostgreSQL pass.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from app.auth.service import TOKEN_CACHE
from app.config import Settings
from app.db import make_engine, make_session_factory
from app.migrate import upgrade
from tests.foundation.builders import add_user
from tests.support.apps import fresh_app
from tests.support.servers import (
    create_pg_database,
    drop_pg_database,
    pg_url,
    stop_session_server,
    wipe_tables,
)
from tests.unix_accounts import unix_accounts  # noqa: F401 - a session fixture for all

BACKEND = os.environ.get("GPUSCHED_TEST_DB", "sqlite")
# Fixtures that mean "this test touches a database" (see the module's docstring).
_DB_FIXTURES = frozenset({"database_url", "_module_stack"})
_PG_FIXTURES = frozenset({"make_stack"})


def pytest_configure(config: pytest.Config) -> None:
    # The CLI reads its URL and token from $XDG_CONFIG_HOME/gpusched before anything else,
    # and `gpusched up` writes them there: each test process (and what it starts) gets a
    # folder of its own, never the developer's ~/.config nor one parallel workers share.
    os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="gpusched-test-config-")
    config.addinivalue_line("markers", "db: touches a database; runs on SQLite and PostgreSQL")
    config.addinivalue_line("markers", "postgresql: needs PostgreSQL whatever the backend")
    # Started once by the controlling process, before xdist starts its workers, so that
    # they (and the stacks they start) share the one server through the environment.
    if BACKEND == "postgresql" and not hasattr(config, "workerinput"):
        pg_url()


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(os.environ["XDG_CONFIG_HOME"], ignore_errors=True)
    if not hasattr(config, "workerinput"):
        stop_session_server()


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by these markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & _PG_FIXTURES:
            item.add_marker(pytest.mark.postgresql)
        if used & _DB_FIXTURES:
            item.add_marker(pytest.mark.db)


@pytest.fixture(autouse=True)
def _umask_restored() -> Iterator[None]:
    """The service commands set umask 077 for their process (app.cli.process_setup.private_files);
    run in this one (typer's CliRunner), they must not change it for the tests after."""
    kept = os.umask(0o022)
    os.umask(kept)
    yield
    os.umask(kept)


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if BACKEND == "postgresql":
        name, url = create_pg_database("gpusched_test")
        yield url
        drop_pg_database(name)
    else:
        path: Path = tmp_path_factory.mktemp("db") / "test.db"
        yield f"sqlite:///{path}"


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url)
    upgrade(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def session_factory(engine: Engine) -> Iterator[sessionmaker[Session]]:
    """A clean database (all tables emptied) for tests that commit and use many connections."""
    wipe_tables(engine)
    TOKEN_CACHE.clear()
    yield make_session_factory(engine)


@pytest.fixture
def db_session(engine: Engine) -> Iterator[Session]:
    """A session inside a transaction that is rolled back after the test (data-layer tests)."""
    connection = engine.connect()
    outer = connection.begin()
    session = Session(bind=connection, join_transaction_mode="create_savepoint")
    try:
        yield session
    finally:
        session.close()
        outer.rollback()
        connection.close()


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return Settings(data_dir=tmp_path / "data", database_url=database_url, token_cache_s=0)


class Api:
    """A TestClient plus ready-made users: admin, alice (project ml), bob (project cv)."""

    def __init__(self, client: TestClient, factory: sessionmaker[Session]) -> None:
        self.client = client
        self.factory = factory
        self.tokens: dict[str, str] = {}

    def add_user(self, name: str, projects: list[str], *, admin: bool = False) -> str:
        self.tokens[name] = add_user(self.factory, name, projects, admin=admin)
        return self.tokens[name]

    def as_(self, user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[user]}"}


@contextmanager
def open_api(settings: Settings, session_factory: sessionmaker[Session]) -> Iterator[Api]:
    """The API app in a TestClient, with its users admin, alice and bob."""
    app = fresh_app(settings, session_factory=session_factory)
    with TestClient(app) as client:
        api = Api(client, session_factory)
        api.add_user("admin", ["default"], admin=True)
        api.add_user("alice", ["ml"])
        api.add_user("bob", ["cv"])
        yield api


@pytest.fixture
def api(settings: Settings, session_factory: sessionmaker[Session]) -> Iterator[Api]:
    with open_api(settings, session_factory) as api:
        yield api
