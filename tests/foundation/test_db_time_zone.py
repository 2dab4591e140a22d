"""Times read from PostgreSQL carry `datetime.UTC` whatever zone the server defaults to:
psycopg gives a timestamptz the session's zone, and comparing datetimes of two different
zone objects (a ZoneInfo against the cycle's clock) costs both zones' utcoffset each time."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from app.db import make_engine


def test_timestamps_read_from_postgresql_carry_datetime_utc(database_url: str) -> None:
    if database_url.startswith("sqlite"):
        pytest.skip("PostgreSQL's session zone; SQLite stores text (UTCDateTime)")
    from tests.support.servers import create_pg_database, drop_pg_database

    name, url = create_pg_database("gpusched_tz")
    engine = make_engine(url)
    try:
        with engine.connect() as conn:  # a zone of the database's own, as a host's
            conn.execute(text(f"ALTER DATABASE {name} SET timezone = 'Europe/Paris'"))
            conn.commit()
        engine.dispose()  # the next connection starts in that zone
        with engine.connect() as conn:
            read = conn.execute(
                text("SELECT CAST('2026-12-03 08:00:00+00' AS timestamptz)")
            ).scalar_one()
    finally:
        engine.dispose()
        drop_pg_database(name)
    assert read == datetime(2026, 12, 3, 8, tzinfo=UTC)
    assert read.tzinfo is UTC
