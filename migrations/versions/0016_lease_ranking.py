"""the queue policy the cycle ranks with, stored on its lease for the API to explain ranks

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-25 05:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("scheduler_lease") as batch:
        batch.add_column(sa.Column("ranking", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("scheduler_lease") as batch:
        batch.drop_column("ranking")
