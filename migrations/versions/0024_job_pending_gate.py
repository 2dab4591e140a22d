"""jobs the clock holds back (begin time ahead, off-peak window closed) are found by index
and carry no queue position: the cycle no longer ranks them

Revision ID: 0024
Revises: 0022
Create Date: 2026-11-26 15:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0024"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_job_pending_gate", "job", ["status", "schedule_mode", "pending_reason", "begin_at"]
    )
    # Positions the planner gave them before: no cycle rewrites those any more.
    op.execute(
        "UPDATE job SET queue_position = NULL "
        "WHERE status = 'PENDING' AND pending_reason = 'begin_time'"
    )


def downgrade() -> None:
    op.drop_index("ix_job_pending_gate", table_name="job")
