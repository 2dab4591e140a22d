"""a job's choice of nodes: only these (any of them), never those (sbatch --exclude)

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-25 01:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.add_column(sa.Column("only_nodes", sa.JSON(), nullable=True))
        batch.add_column(
            sa.Column("exclude_nodes", sa.JSON(), nullable=False, server_default=sa.text("'[]'"))
        )


def downgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.drop_column("exclude_nodes")
        batch.drop_column("only_nodes")
