"""Engine, session factory and the declarative base shared by every domain's models."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any

from sqlalchemy import (
    ARRAY,
    JSON,
    Connection,
    DateTime,
    Integer,
    MetaData,
    Select,
    Table,
    TypeDecorator,
    any_,
    bindparam,
    create_engine,
    event,
    insert,
    select,
    text,
    update,
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
    """Insert `rows` (all with the same keys) in one statement. On PostgreSQL the rows go
    as one JSON document that the server turns into records (`json_to_recordset`): an
    executemany is one INSERT per row for the server, a multi-row VALUES has psycopg
    parse (in Python) a query of thousands of parameters, and arrays of each column have
    it dump every value (in Python); for the 250 allocations of a cycle at 1,000 nodes an
    executemany took 25-35 ms against 13 for arrays. Elsewhere one executemany."""
    if not rows:
        return
    if connection.dialect.name != "postgresql":
        connection.execute(insert(table), list(rows))
        return
    names = list(rows[0])
    quote = connection.dialect.identifier_preparer.quote
    fields, records = _json_records(connection.dialect, table, names, rows)
    connection.execute(
        text(
            f"INSERT INTO {quote(table.name)} ({', '.join(map(quote, names))}) "
            f"SELECT {', '.join(map(quote, names))} "
            f"FROM json_to_recordset(CAST(:records AS json)) AS v({fields})"
        ),
        {"records": records},
    )


def update_rows(connection: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """Update rows by primary key `id`: each of `rows` (all with the same keys) holds the
    id and the new values. The rows are locked in id order, so that writers of several
    rows never wait for each other's crosswise. On PostgreSQL one ordered read takes the
    locks (`lock_in_id_order`) and one statement joins the rows, sent as one JSON
    document (as `insert_rows`): as an executemany, the reports process spent a third of
    its time on heartbeats' GPU rows, one UPDATE each, in SQLAlchemy's parameter handling
    and psycopg's pipeline. Elsewhere one executemany in id order (SQLite locks the whole
    database for a write anyway)."""
    if not rows:
        return
    ordered = sorted(rows, key=itemgetter("id"))
    if connection.dialect.name != "postgresql" or len(ordered) == 1:
        connection.execute(
            update(table).where(table.c.id == bindparam("b_id")),
            [{"b_id" if k == "id" else k: v for k, v in row.items()} for row in ordered],
        )
        return
    names = list(ordered[0])
    quote = connection.dialect.identifier_preparer.quote
    lock_in_id_order(connection, table, [row["id"] for row in ordered])
    fields, records = _json_records(connection.dialect, table, names, ordered)
    name = quote(table.name)
    sets = ", ".join(f"{quote(n)} = v.{quote(n)}" for n in names if n != "id")
    connection.execute(
        text(
            f"UPDATE {name} SET {sets} FROM json_to_recordset(CAST(:records AS json)) "
            f"AS v({fields}) WHERE {name}.id = v.id"
        ),
        {"records": records},
    )


def lock_in_id_order(connection: Connection, table: Table, ids: Sequence[int]) -> None:
    """Lock rows by one read, in id order (PostgreSQL): FOR NO KEY UPDATE, the lock an
    UPDATE takes, so that a foreign key check (KEY SHARE) does not wait for it."""
    connection.execute(_lock_statement(table), {"ids": list(ids)})


@functools.cache
def _lock_statement(table: Table) -> Select[tuple[int]]:
    # Built once per table: constructing it was half the cost of each heartbeat's lock.
    return (
        select(table.c.id)
        .where(table.c.id == any_(bindparam("ids", type_=ARRAY(Integer))))
        .order_by(table.c.id)
        .with_for_update(key_share=True)
    )


def _json_records(
    dialect: Dialect, table: Table, names: Sequence[str], rows: Sequence[Mapping[str, Any]]
) -> tuple[str, str]:
    """`rows` as a JSON array of objects, each value as its column's type binds it (a
    JSON column's as is, nested), and the column definitions that type them back
    (`json_to_recordset`'s). A float that is not finite goes as a string, which the
    server reads as the same float (JSON has no NaN)."""
    quote = dialect.identifier_preparer.quote
    fields = []
    to_bind: dict[str, Callable[[Any], Any]] = {}
    for name in names:
        column_type = table.c[name].type
        fields.append(f"{quote(name)} {column_type.compile(dialect=dialect)}")
        bind = (
            None
            if isinstance(column_type, JSON)
            else column_type.dialect_impl(dialect).bind_processor(dialect)
        )
        if bind is not None:
            to_bind[name] = bind
    if to_bind:
        rows = [{**row, **{n: bind(row[n]) for n, bind in to_bind.items()}} for row in rows]
    try:
        records = json.dumps(rows, default=_json_scalar, allow_nan=False)
    except ValueError:  # NaN or infinity, which JSON cannot say
        records = json.dumps(
            [{n: _finite_or_text(v) for n, v in row.items()} for row in rows],
            default=_json_scalar,
        )
    return ", ".join(fields), records


def _json_scalar(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not a column value")


def _finite_or_text(value: Any) -> Any:
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


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
    engine = create_engine(url, **kwargs)

    @event.listens_for(engine, "connect")
    def _utc_session(dbapi_conn: Any, _record: Any) -> None:
        # psycopg gives timestamptz values the session's zone: `datetime.UTC` for "UTC",
        # a ZoneInfo for any other name, such as the "Etc/UTC" many servers take from
        # their host. Comparing datetimes of two zone objects calls both zones' utcoffset
        # (2.6 times as slow, and a timedelta made each time): at 1,000 nodes that was a
        # tenth of the scheduler's CPU, in the GPU prechecks against the cycle's clock.
        with dbapi_conn.cursor() as cursor:
            cursor.execute("SET TIME ZONE 'UTC'")
        dbapi_conn.commit()

    return engine


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
