"""a project's fair-share usage as the scheduler last ranked by it (gpusched queues)

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24 22:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("project") as batch:
        batch.add_column(sa.Column("usage_gpu_s", sa.Float(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("usage_at", app.db.UTCDateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("project") as batch:
        batch.drop_column("usage_at")
        batch.drop_column("usage_gpu_s")
