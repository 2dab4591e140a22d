"""cron batches' concurrency policy (allow, forbid, replace) and each job's batch

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24 16:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("batch_schedule") as batch:
        # Existing batches keep what they did: every firing submits.
        batch.add_column(
            sa.Column("concurrency", sa.String(8), nullable=False, server_default="allow")
        )
    with op.batch_alter_table("job") as batch:
        # Jobs already submitted by batches are not traced back: a forbid or replace
        # policy set now sees only the jobs its later firings submit.
        batch.add_column(sa.Column("batch_id", sa.Integer(), nullable=True))
        batch.create_foreign_key(
            "fk_job_batch_id_batch_schedule", "batch_schedule", ["batch_id"], ["id"],
            ondelete="SET NULL",
        )
        batch.create_index("ix_job_batch_id", ["batch_id"])


def downgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.drop_index("ix_job_batch_id")
        batch.drop_constraint("fk_job_batch_id_batch_schedule", type_="foreignkey")
        batch.drop_column("batch_id")
    with op.batch_alter_table("batch_schedule") as batch:
        batch.drop_column("concurrency")
