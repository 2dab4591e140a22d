"""Shared fixtures.

The database under test is chosen by GPUSCHED_TEST_DB: "sqlite" (default) or "postgresql"
(then GPUSCHED_TEST_PG_URL points at a server; each test session gets its own database,
created here and dropped at the end, so parallel runs never collide).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session, sessionmaker

from app.auth.service import TOKEN_CACHE
from app.config import Settings
from app.db import make_engine, make_session_factory
from app.main import create_app
from app.migrate import upgrade
from bench.common import wipe_tables
from tests.foundation.builders import add_user
from tests.unix_accounts import unix_accounts  # noqa: F401 - a session fixture for all

BACKEND = os.environ.get("GPUSCHED_TEST_DB", "sqlite")
PG_URL = os.environ.get("GPUSCHED_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _create_pg_database() -> tuple[str, str]:
    name = f"gpusched_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return name, make_url(PG_URL).set(database=name).render_as_string(hide_password=False)


def _drop_pg_database(name: str) -> None:
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(autouse=True)
def _umask_restored() -> Iterator[None]:
    """The service commands set umask 077 for their process (app.cli.server.private_files);
    run in this one (typer's CliRunner), they must not change it for the tests after."""
    kept = os.umask(0o022)
    os.umask(kept)
    yield
    os.umask(kept)


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if BACKEND == "postgresql":
        name, url = _create_pg_database()
        yield url
        _drop_pg_database(name)
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


@pytest.fixture
def api(settings: Settings, session_factory: sessionmaker[Session]) -> Iterator[Api]:
    app = create_app(settings, session_factory=session_factory)
    with TestClient(app) as client:
        api = Api(client, session_factory)
        api.add_user("admin", ["default"], admin=True)
        api.add_user("alice", ["ml"])
        api.add_user("bob", ["cv"])
        yield api
