"""Engine, session factory and the declarative base shared by every domain's models."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Connection,
    DateTime,
    MetaData,
    Table,
    TypeDecorator,
    create_engine,
    event,
    insert,
    text,
)
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

# Stable constraint names so Alembic autogenerate and downgrades agree on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite drops tzinfo otherwise)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime stored; use an aware UTC datetime")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


JSONType = JSON
# For optional JSON columns that are queried with IS NULL: Python None is stored as SQL NULL.
NullableJSON = JSON(none_as_null=True)


def utcnow() -> datetime:
    return datetime.now(UTC)


def _compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def insert_rows(connection: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert `rows` (all with the same keys) in one statement. On PostgreSQL the columns
    go as arrays joined by unnest: an executemany is one INSERT per row for the server,
    and a multi-row VALUES has psycopg parse (in Python) a query of thousands of
    parameters; for the 250 allocations of a cycle at 1,000 nodes that was 25-35 ms
    against 13. Elsewhere one executemany."""
    if not rows:
        return
    dialect = connection.dialect
    if dialect.name != "postgresql":
        connection.execute(insert(table), list(rows))
        return
    names = list(rows[0])
    quote = dialect.identifier_preparer.quote
    arrays: dict[str, list[Any]] = {}
    casts = []
    for i, name in enumerate(names):
        column_type = table.c[name].type
        to_bind = column_type.dialect_impl(dialect).bind_processor(dialect)
        values = [row[name] for row in rows]
        arrays[f"c{i}"] = values if to_bind is None else [to_bind(v) for v in values]
        casts.append(f"CAST(:c{i} AS {column_type.compile(dialect=dialect)}[])")
    connection.execute(
        text(
            f"INSERT INTO {quote(table.name)} ({', '.join(map(quote, names))}) "
            f"SELECT * FROM unnest({', '.join(casts)})"
        ),
        arrays,
    )


def make_engine(url: str, **kwargs: Any) -> Engine:
    # Bound values include token hashes and jobs' env: never print them in SQL logs.
    kwargs.setdefault("hide_parameters", True)
    # Without the spaces json.dumps puts after each comma: the stored ranking is 20,000
    # jobs' worth of lists, written every full cycle.
    kwargs.setdefault("json_serializer", _compact_json)
    if url.startswith("sqlite"):
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, **kwargs
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            # WAL lets the API read while the scheduler writes; foreign keys are off by default.
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()
            # We issue BEGIN ourselves (below); pysqlite would otherwise start transactions
            # late, at the first write.
            dbapi_conn.isolation_level = None

        @event.listens_for(engine, "begin")
        def _begin_immediate(conn: Any) -> None:
            if conn.get_execution_options().get(READ_ONLY):
                # WAL: a reader sees the last commit and never waits for a writer. Taking
                # the write lock here let the scheduler's stream of short transactions
                # starve API reads for many seconds on a busy machine.
                conn.exec_driver_sql("BEGIN")
                return
            # SQLite ignores SELECT ... FOR UPDATE. Taking the write lock when a transaction
            # starts makes read-check-write sequences (two agent reports about one job, a
            # cancel racing a placement) serialise as they do on PostgreSQL.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    kwargs.setdefault("pool_size", 20)
    kwargs.setdefault("max_overflow", 20)
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(url, **kwargs)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


# Execution option of engines whose transactions only read (see make_engine).
READ_ONLY = "gpusched_read_only"


def make_read_session_factory(factory: sessionmaker[Session]) -> sessionmaker[Session]:
    """Sessions for work that only reads, on the same pool. On SQLite their transactions
    take no write lock; elsewhere they are ordinary sessions."""
    engine: Engine = factory.kw["bind"]
    return sessionmaker(engine.execution_options(**{READ_ONLY: True}), expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on any error."""
    with factory() as session, session.begin():
        yield session


# session.info key of the actions after_commit() queued on a session.
_AFTER_COMMIT = "gpusched_after_commit"


def after_commit(session: Session, action: Callable[[], None]) -> None:
    """Run `action` once the session's transaction has committed; drop it if the
    transaction rolls back. For in-process effects of a change (a metric observed when a
    job starts), so that a report retried after a rollback is not counted twice."""
    session.info.setdefault(_AFTER_COMMIT, []).append(action)


@event.listens_for(Session, "after_commit")
def _run_after_commit(session: Session) -> None:
    for action in session.info.pop(_AFTER_COMMIT, []):
        action()


@event.listens_for(Session, "after_transaction_end")
def _drop_after_commit(session: Session, transaction: Any) -> None:
    # After after_commit has run them; what is left was rolled back (or closed uncommitted).
    if transaction.parent is None:  # the whole transaction, not a savepoint
        session.info.pop(_AFTER_COMMIT, None)
