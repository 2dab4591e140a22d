"""the shortest grace period a cancel asked for, so that a lost stop is re-sent with it

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24 13:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job") as batch:
        # Null: the cancel asked for no shorter grace (the job's own applies).
        batch.add_column(sa.Column("cancel_grace_s", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.drop_column("cancel_grace_s")
