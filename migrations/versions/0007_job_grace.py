"""a job's own stop grace period (SIGTERM to SIGKILL), to checkpoint

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24 06:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job") as batch:
        # Null: the agent's own grace period, which is what every existing job had.
        batch.add_column(sa.Column("grace_s", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.drop_column("grace_s")
