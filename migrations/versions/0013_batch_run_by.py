"""who ran a batch by hand (`gpusched batch run`, as `kubectl create job --from=cronjob/`)

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-25 01:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("batch_firing") as batch:
        batch.add_column(sa.Column("run_by", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batch_firing") as batch:
        batch.drop_column("run_by")
