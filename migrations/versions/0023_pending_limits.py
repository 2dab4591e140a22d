"""how many jobs a user, and a project, may have pending (Slurm's MaxSubmitJobs and
GrpSubmitJobs); an index for counting a user's pending jobs at each submission

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-26 15:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("user_account") as batch:
        batch.add_column(sa.Column("max_pending_jobs", sa.Integer(), nullable=True))
    with op.batch_alter_table("project") as batch:
        batch.add_column(sa.Column("max_pending_jobs", sa.Integer(), nullable=True))
    op.create_index("ix_job_user_status", "job", ["user_id", "status"])


def downgrade() -> None:
    op.drop_index("ix_job_user_status", table_name="job")
    with op.batch_alter_table("project") as batch:
        batch.drop_column("max_pending_jobs")
    with op.batch_alter_table("user_account") as batch:
        batch.drop_column("max_pending_jobs")
