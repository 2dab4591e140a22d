"""a node's maintenance time (gpusched drain --at: Slurm's maint reservation)

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24 21:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("node") as batch:
        batch.add_column(
            sa.Column("maintenance_at", app.db.UTCDateTime(timezone=True), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("node") as batch:
        batch.drop_column("maintenance_at")
