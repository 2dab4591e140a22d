"""a change-stamp on each job: every UPDATE of a row adds one to its row_version (a
trigger, whoever writes), so a full cycle re-reads only the waiting jobs whose stamp
moved since it read them (issue 42 point 4)

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-27 14:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A statement that sets row_version itself (the cycle's bulk reason writes add one in the
# same statement) is left as it wrote it: on SQLite that spares a second write per row.
POSTGRESQL = (
    """
    CREATE FUNCTION job_row_version() RETURNS trigger AS $$
    BEGIN
        NEW.row_version := OLD.row_version + 1;
        RETURN NEW;
    END
    $$ LANGUAGE plpgsql
    """,
    # The condition is the trigger's, not the function's: a row it does not hold for
    # (the cycle's bulk writes, 20,000 rows) calls no function at all.
    """
    CREATE TRIGGER job_row_version BEFORE UPDATE ON job
    FOR EACH ROW WHEN (NEW.row_version = OLD.row_version)
    EXECUTE FUNCTION job_row_version()
    """,
)
SQLITE = (
    """
    CREATE TRIGGER job_row_version AFTER UPDATE ON job
    FOR EACH ROW WHEN NEW.row_version = OLD.row_version
    BEGIN
        UPDATE job SET row_version = OLD.row_version + 1 WHERE id = NEW.id;
    END
    """,
)


def upgrade() -> None:
    with op.batch_alter_table("job") as batch_op:
        batch_op.add_column(
            sa.Column("row_version", sa.Integer(), server_default="0", nullable=False)
        )
    postgresql = op.get_bind().dialect.name == "postgresql"
    for statement in POSTGRESQL if postgresql else SQLITE:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER job_row_version ON job")
        op.execute("DROP FUNCTION job_row_version()")
    else:
        op.execute("DROP TRIGGER job_row_version")
    with op.batch_alter_table("job") as batch_op:
        batch_op.drop_column("row_version")
