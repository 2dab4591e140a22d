"""what the last full cycle ranked: each waiting job's place and why, for
GET /api/v1/jobs/{id}/rank (issue 42 point 3)

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-26 20:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "queue_ranking",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("ranked_at", app.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("next_at", app.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("ranking", sa.JSON(), nullable=False),
        sa.Column("ranks", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_queue_ranking")),
    )


def downgrade() -> None:
    op.drop_table("queue_ranking")
