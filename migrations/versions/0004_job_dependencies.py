"""job dependencies (depends_on, sbatch --dependency=afterok)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24 01:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job") as batch:
        # Existing jobs depend on nothing; the model's defaults cover new ones.
        batch.add_column(
            sa.Column("depends_on", sa.JSON(), nullable=False, server_default=sa.text("'[]'"))
        )
        batch.add_column(
            sa.Column(
                "dependencies_met", sa.Boolean(), nullable=False, server_default=sa.true()
            )
        )
        # It now also counts time spent waiting on dependencies, not only time held.
        batch.alter_column("held_s", new_column_name="ineligible_s")


def downgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.alter_column("ineligible_s", new_column_name="held_s")
        batch.drop_column("dependencies_met")
        batch.drop_column("depends_on")
