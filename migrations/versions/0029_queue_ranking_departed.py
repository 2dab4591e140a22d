"""queue positions come from the stored ranking (issue 42 point 4): `departed` lists the
ranked jobs that left the queue since (placed by a later cycle), so the jobs behind them
move up without a write of theirs; `ranks_id` names each rewrite of `ranks`, so the API
decodes them once per ranking, not once per full cycle that found them unchanged

Revision ID: 0029
Revises: 0028
Create Date: 2026-11-27 15:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0029"
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("queue_ranking") as batch_op:
        batch_op.add_column(sa.Column("departed", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("ranks_id", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("queue_ranking") as batch_op:
        batch_op.drop_column("ranks_id")
        batch_op.drop_column("departed")
