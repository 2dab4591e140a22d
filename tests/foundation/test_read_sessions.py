"""On SQLite, a transaction that only reads must not wait for the write lock: in WAL mode it
sees the last commit. API GETs use such sessions, so the scheduler's stream of short write
transactions cannot starve them (it did: a job RUNNING for 16 s was never seen by a client
polling every 50 ms on a loaded machine)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.db import make_read_session_factory
from app.projects.models import Project

pytestmark = pytest.mark.skipif(
    os.environ.get("GPUSCHED_TEST_DB", "sqlite") != "sqlite",
    reason="SQLite's database-wide write lock; PostgreSQL readers never wait for writers",
)


def _while_writing(factory: sessionmaker[Session], read: Callable[[], Any]) -> Any:
    """Run `read` in a thread while another session holds the write lock with an
    uncommitted row; fail if it waits for that lock."""
    writer = factory()
    writer.add(Project(name="uncommitted"))
    writer.flush()  # BEGIN IMMEDIATE: the write lock is held until rollback
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(value=read()))
    thread.start()
    try:
        # Well short of SQLite's busy timeout (30 s, app/db.py), which a read waiting for
        # the lock would sit out, and long enough for a slow read on a loaded machine.
        thread.join(timeout=20)
        assert not thread.is_alive(), "the read waited for the writer's lock"
        return result["value"]
    finally:
        writer.rollback()
        writer.close()
        thread.join()


def test_read_session_does_not_wait_for_a_writer(session_factory: sessionmaker[Session]) -> None:
    reads = make_read_session_factory(session_factory)

    def names() -> list[str]:
        with reads() as session:
            return list(session.scalars(select(Project.name)))

    assert "uncommitted" not in _while_writing(session_factory, names)


def test_api_get_does_not_wait_for_a_writer(api: Any) -> None:
    response = _while_writing(
        api.factory, lambda: api.client.get("/api/v1/jobs", headers=api.as_("alice"))
    )
    assert response.status_code == 200, response.text
