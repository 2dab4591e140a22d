"""Run Alembic migrations from code (CLI `gpusched migrate`, server start, tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.util.exc import CommandError
from sqlalchemy.engine import Engine

ROOT = Path(__file__).resolve().parent.parent


def alembic_config(url: str) -> Config:
    if not (ROOT / "migrations").is_dir():
        # A plain `pip install .` copies the packages into site-packages and leaves
        # migrations/ (and the dashboard) behind in the source tree.
        raise CommandError(
            f"no migrations/ directory beside the app package in {ROOT}: run gpusched from a "
            "source checkout or an editable install (`pip install -e .`, as `make install` "
            "and the Docker image do)"
        )
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "migrations"))
    # ConfigParser interpolation: a literal % in a password must be doubled.
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as connection:
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, revision)


def downgrade(engine: Engine, revision: str = "base") -> None:
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as connection:
        cfg.attributes["connection"] = connection
        command.downgrade(cfg, revision)
