"""where each allocation's row last changed (`allocation.changed_in`), so that a cycle
reads only the allocations placed or released since its last read, not every one held:
at 1,000 nodes x 8 GPUs, reading and summing the 8,000 held each cycle was a third of a
quick cycle's snapshot (issue 35 point 4). And an index on `released_at`, which the
full cycle's read of the fair-share horizon asks by.

PostgreSQL: the writing transaction's id, on insert (the column's default) and on every
update (a trigger), as `gpu.changed_in` (0032). Indexed, as `job.changed_in` is: the
table keeps every attempt's allocations until retention removes their job.

SQLite: the column, always 0; its cycle reads every allocation held, as before.

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-01 05:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0033"
down_revision: str | None = "0032"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

POSTGRESQL = (
    "ALTER TABLE allocation ALTER COLUMN changed_in"
    " SET DEFAULT (pg_current_xact_id()::text::bigint)",
    """
    CREATE FUNCTION allocation_changed_in() RETURNS trigger AS $$
    BEGIN
        NEW.changed_in := pg_current_xact_id()::text::bigint;
        RETURN NEW;
    END
    $$ LANGUAGE plpgsql
    """,
    """
    CREATE TRIGGER allocation_changed_in BEFORE UPDATE ON allocation
    FOR EACH ROW EXECUTE FUNCTION allocation_changed_in()
    """,
)


def upgrade() -> None:
    # Allocations from before: 0, which every reader's first read (all held) covers.
    with op.batch_alter_table("allocation") as batch_op:
        batch_op.add_column(
            sa.Column("changed_in", sa.BigInteger(), server_default="0", nullable=False)
        )
        batch_op.create_index("ix_allocation_changed_in", ["changed_in"])
        batch_op.create_index("ix_allocation_released_at", ["released_at"])
    if op.get_bind().dialect.name == "postgresql":
        for statement in POSTGRESQL:
            op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER allocation_changed_in ON allocation")
        op.execute("DROP FUNCTION allocation_changed_in()")
    with op.batch_alter_table("allocation") as batch_op:
        batch_op.drop_index("ix_allocation_released_at")
        batch_op.drop_index("ix_allocation_changed_in")
        batch_op.drop_column("changed_in")
