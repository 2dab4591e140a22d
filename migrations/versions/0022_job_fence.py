"""jobs run as their owner's account, fenced per installation: the installation's id,
users' unix accounts, nodes' isolation, accounts and default grace, jobs' host usage and
the end of a lost attempt's grace

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-26 12:00:00
"""

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

import app.db

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    installation = op.create_table(
        "installation",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("created_at", app.db.UTCDateTime(timezone=True), nullable=False),
    )
    op.bulk_insert(installation, [{"id": uuid.uuid4().hex, "created_at": datetime.now(UTC)}])
    # Each user's jobs run as their Unix account: by default the one of their name.
    with op.batch_alter_table("user_account") as batch:
        batch.add_column(sa.Column("unix_user", sa.String(64), nullable=True))
    op.execute("UPDATE user_account SET unix_user = name")
    with op.batch_alter_table("user_account") as batch:
        batch.alter_column("unix_user", existing_type=sa.String(64), nullable=False)
    with op.batch_alter_table("node") as batch:
        batch.add_column(sa.Column("isolation", sa.String(32), nullable=False, server_default=""))
        batch.add_column(sa.Column("jobs_run_as", sa.String(64), nullable=True))
        batch.add_column(sa.Column("unusable_accounts", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("grace_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("interval_s", sa.Float(), nullable=True))
    with op.batch_alter_table("job") as batch:
        batch.add_column(sa.Column("cpu_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("memory_peak_mb", sa.Integer(), nullable=True))
        batch.add_column(
            sa.Column("lost_until", app.db.UTCDateTime(timezone=True), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.drop_column("lost_until")
        batch.drop_column("memory_peak_mb")
        batch.drop_column("cpu_s")
    with op.batch_alter_table("node") as batch:
        batch.drop_column("interval_s")
        batch.drop_column("grace_s")
        batch.drop_column("unusable_accounts")
        batch.drop_column("jobs_run_as")
        batch.drop_column("isolation")
    with op.batch_alter_table("user_account") as batch:
        batch.drop_column("unix_user")
    op.drop_table("installation")
