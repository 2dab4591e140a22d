"""where each GPU's row last changed (`gpu.changed_in`), so that a cycle reads only the GPUs
that a heartbeat or a placement changed since its last read, not all of them: at 1,000
nodes x 8 GPUs, reading 8,000 rows was the largest part of every cycle's snapshot
(issue 35 point 4)

PostgreSQL: the writing transaction's id (pg_current_xact_id), on insert (the column's
default) and on every update (a trigger), as `job.changed_in` (0030); the reader makes up
for ids handed out in start order, not commit order, in the same way.

SQLite: the column, always 0. A laptop's cluster is a few nodes, and SQLite's cycle reads
every GPU (a counter trigger, as 0030's, would double each heartbeat's writes there).

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-01 01:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0032"
down_revision: str | None = "0031"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

POSTGRESQL = (
    "ALTER TABLE gpu ALTER COLUMN changed_in SET DEFAULT (pg_current_xact_id()::text::bigint)",
    """
    CREATE FUNCTION gpu_changed_in() RETURNS trigger AS $$
    BEGIN
        NEW.changed_in := pg_current_xact_id()::text::bigint;
        RETURN NEW;
    END
    $$ LANGUAGE plpgsql
    """,
    """
    CREATE TRIGGER gpu_changed_in BEFORE UPDATE ON gpu
    FOR EACH ROW EXECUTE FUNCTION gpu_changed_in()
    """,
)


def upgrade() -> None:
    # GPUs from before: 0, which every reader's first read (all GPUs) covers.
    with op.batch_alter_table("gpu") as batch_op:
        batch_op.add_column(
            sa.Column("changed_in", sa.BigInteger(), server_default="0", nullable=False)
        )
    if op.get_bind().dialect.name == "postgresql":
        for statement in POSTGRESQL:
            op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER gpu_changed_in ON gpu")
        op.execute("DROP FUNCTION gpu_changed_in()")
    with op.batch_alter_table("gpu") as batch_op:
        batch_op.drop_column("changed_in")
