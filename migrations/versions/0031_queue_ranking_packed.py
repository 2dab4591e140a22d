"""the stored ranking's order packed (`queue_ranking.packed`: each ranked job's id and
class as 32-bit integers), written as it is: a full cycle rewrites it whenever the order
moves, and 20,000 jobs' numbers as JSON took the database about 20 ms to check and
compress each time, the packed bytes 3 ms (issue 42 point 4)

Revision ID: 0031
Revises: 0030
Create Date: 2026-11-30 06:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0031"
down_revision: str | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("queue_ranking") as batch_op:
        batch_op.add_column(sa.Column("packed", sa.LargeBinary(), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        # Out of line, not compressed: numbers that hardly compress, rewritten often.
        op.execute("ALTER TABLE queue_ranking ALTER COLUMN packed SET STORAGE EXTERNAL")


def downgrade() -> None:
    with op.batch_alter_table("queue_ranking") as batch_op:
        batch_op.drop_column("packed")
