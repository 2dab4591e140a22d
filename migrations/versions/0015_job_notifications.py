"""job notifications by webhook (notify_url, notify_on) and their outbox

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-25 02:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.add_column(sa.Column("notify_url", sa.String(length=2048), nullable=True))
        batch.add_column(
            sa.Column("notify_on", sa.JSON(), nullable=False, server_default=sa.text("'[]'"))
        )
    op.create_table(
        "notification",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "job_id", sa.Integer(), sa.ForeignKey("job.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("event", sa.String(length=8), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("created_at", app.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("next_at", app.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("sent_at", app.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("error", sa.String(length=512), nullable=True),
    )
    op.create_index("ix_notification_job_id", "notification", ["job_id"])
    op.create_index("ix_notification_due", "notification", ["sent_at", "next_at"])


def downgrade() -> None:
    op.drop_index("ix_notification_due", table_name="notification")
    op.drop_index("ix_notification_job_id", table_name="notification")
    op.drop_table("notification")
    with op.batch_alter_table("job") as batch:
        batch.drop_column("notify_on")
        batch.drop_column("notify_url")
