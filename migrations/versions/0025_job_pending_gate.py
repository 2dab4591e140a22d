"""a deep queue is read by index: jobs the clock holds back (begin time ahead, off-peak
window closed), new arrivals, throttled arrays, jobs waiting on dependencies; jobs waiting
for their begin time carry no queue position (no cycle ranks them any more)

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-26 15:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = {
    "ix_job_pending_mode": ["status", "schedule_mode", "begin_at"],
    "ix_job_pending_reason": ["status", "pending_reason", "schedule_mode", "begin_at"],
    "ix_job_pending_array_limit": ["status", "array_max_running"],
}


def upgrade() -> None:
    for name, columns in INDEXES.items():
        op.create_index(name, "job", columns)
    op.create_index(
        "ix_job_waiting_dependencies",
        "job",
        ["status"],
        sqlite_where=sa.text("dependencies_met IS 0"),
        postgresql_where=sa.text("dependencies_met IS false"),
    )
    # Positions the planner gave them before: no cycle rewrites those any more.
    op.execute(
        "UPDATE job SET queue_position = NULL "
        "WHERE status = 'PENDING' AND pending_reason = 'begin_time'"
    )


def downgrade() -> None:
    for name in [*INDEXES, "ix_job_waiting_dependencies"]:
        op.drop_index(name, table_name="job")
