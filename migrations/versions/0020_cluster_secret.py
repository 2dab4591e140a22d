"""the installation's secret, from which each node's message-signing key is derived

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27 10:00:00
"""

import secrets
from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

import app.db

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Each installation's own, created here; a database emptied since gets a new one at
    # first use (app.nodes.keys).
    table = op.create_table(
        "cluster_secret",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("secret_hex", sa.String(length=128), nullable=False),
        sa.Column("created_at", app.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cluster_secret")),
    )
    op.bulk_insert(
        table, [{"id": 1, "secret_hex": secrets.token_hex(32), "created_at": datetime.now(UTC)}]
    )


def downgrade() -> None:
    op.drop_table("cluster_secret")
