"""held jobs (gpusched hold / release)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 22:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.add_column(sa.Column("held_by", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("held_at", app.db.UTCDateTime(timezone=True), nullable=True))
        # Existing rows were never held; the model's default covers new ones.
        batch.add_column(
            sa.Column("held_s", sa.Integer(), nullable=False, server_default=sa.text("0"))
        )


def downgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.drop_column("held_s")
        batch.drop_column("held_at")
        batch.drop_column("held_by")
