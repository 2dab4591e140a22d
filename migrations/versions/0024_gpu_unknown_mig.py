"""GPUs whose deciding readings failed (unknown, not free) and MIG-enabled GPUs

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-26 15:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("gpu") as batch:
        batch.add_column(sa.Column("unknown_readings", sa.JSON(), nullable=True))
        batch.add_column(
            sa.Column("mig_enabled", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("gpu") as batch:
        batch.drop_column("mig_enabled")
        batch.drop_column("unknown_readings")
