"""how many jobs a user, and a project, may run at once and how many GPUs they may use
(Slurm's MaxJobs / GrpJobs and MaxTRES / GrpTRES=gres/gpu); null: no limit

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-26 20:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("user_account", "project")
COLUMNS = ("max_running_jobs", "max_gpus")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            for column in COLUMNS:
                batch.add_column(sa.Column(column, sa.Integer(), nullable=True))


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            for column in reversed(COLUMNS):
                batch.drop_column(column)
