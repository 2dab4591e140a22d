"""job arrays (sbatch --array): array id, task index, task count, throttle

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 03:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job") as batch:
        # Existing jobs are no array's tasks: all null.
        batch.add_column(sa.Column("array_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("array_index", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("array_size", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("array_max_running", sa.Integer(), nullable=True))
        batch.create_index("ix_job_array_id", ["array_id"])


def downgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.drop_index("ix_job_array_id")
        batch.drop_column("array_max_running")
        batch.drop_column("array_size")
        batch.drop_column("array_index")
        batch.drop_column("array_id")
