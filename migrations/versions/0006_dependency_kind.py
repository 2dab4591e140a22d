"""dependency kinds (sbatch --dependency=afterany, afternotok)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 04:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job") as batch:
        # Every existing dependency is afterok: the only kind there was.
        batch.add_column(
            sa.Column(
                "dependency_kind",
                sa.String(16),
                nullable=False,
                server_default=sa.text("'afterok'"),
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.drop_column("dependency_kind")
