"""where each job last changed, in write order (`changed_in`), so that a full cycle asks
the database for the jobs changed since its last read (by index) instead of reading
every waiting job's stamp (issue 42 point 4)

PostgreSQL: the writing transaction's id (pg_current_xact_id), on insert (the column's
default) and on every update (the row_version trigger). Transaction ids are handed out in
start order, not commit order; the reader makes up for it by asking next time also for
the ids of the transactions still running when it read (app/cycle/snapshot.py).

SQLite: a counter (job_change.n) moved by every update; SQLite has one writer at a time,
so counters are taken in commit order. A new row keeps 0: the reader finds new rows by
their id (SQLite gives each one more than the highest id there), and a trigger per
inserted row made a bulk submission half as slow again.

Revision ID: 0030
Revises: 0029
Create Date: 2026-11-30 06:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0030"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

POSTGRESQL = (
    "ALTER TABLE job ALTER COLUMN changed_in SET DEFAULT (pg_current_xact_id()::text::bigint)",
    # As in 0028, the condition is the trigger's: the cycle's bulk writes set both columns.
    """
    CREATE OR REPLACE FUNCTION job_row_version() RETURNS trigger AS $$
    BEGIN
        NEW.row_version := OLD.row_version + 1;
        NEW.changed_in := pg_current_xact_id()::text::bigint;
        RETURN NEW;
    END
    $$ LANGUAGE plpgsql
    """,
)
SQLITE = (
    "DROP TRIGGER job_row_version",
    # A statement that sets both columns itself (the cycle's bulk writes) is left as is.
    """
    CREATE TRIGGER job_row_version AFTER UPDATE ON job
    FOR EACH ROW WHEN NEW.row_version = OLD.row_version AND NEW.changed_in = OLD.changed_in
    BEGIN
        UPDATE job_change SET n = n + 1;
        UPDATE job SET row_version = OLD.row_version + 1,
            changed_in = (SELECT n FROM job_change) WHERE id = NEW.id;
    END
    """,
)
SQLITE_0028 = """
    CREATE TRIGGER job_row_version AFTER UPDATE ON job
    FOR EACH ROW WHEN NEW.row_version = OLD.row_version
    BEGIN
        UPDATE job SET row_version = OLD.row_version + 1 WHERE id = NEW.id;
    END
"""
POSTGRESQL_0028 = """
    CREATE OR REPLACE FUNCTION job_row_version() RETURNS trigger AS $$
    BEGIN
        NEW.row_version := OLD.row_version + 1;
        RETURN NEW;
    END
    $$ LANGUAGE plpgsql
"""


def upgrade() -> None:
    # Jobs from before: 0, which every reader's first read (all waiting jobs) covers.
    with op.batch_alter_table("job") as batch_op:
        batch_op.add_column(
            sa.Column("changed_in", sa.BigInteger(), server_default="0", nullable=False)
        )
        batch_op.create_index("ix_job_changed_in", ["changed_in"])
    # SQLite's counter (one row); PostgreSQL has it too, unused, so the schema is one.
    op.create_table(
        "job_change",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("n", sa.BigInteger(), nullable=False),
    )
    op.execute("INSERT INTO job_change (id, n) VALUES (1, 0)")
    postgresql = op.get_bind().dialect.name == "postgresql"
    for statement in POSTGRESQL if postgresql else SQLITE:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(POSTGRESQL_0028)
    else:
        op.execute("DROP TRIGGER job_row_version")
    op.drop_table("job_change")
    with op.batch_alter_table("job") as batch_op:
        batch_op.drop_index("ix_job_changed_in")
        batch_op.drop_column("changed_in")
    if op.get_bind().dialect.name != "postgresql":
        op.execute(SQLITE_0028)
