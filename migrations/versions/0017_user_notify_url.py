"""a user's default notification URL (as Slurm mails the submitting user by default)

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-25 06:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("user_account") as batch:
        batch.add_column(sa.Column("notify_url", sa.String(length=2048), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("user_account") as batch:
        batch.drop_column("notify_url")
