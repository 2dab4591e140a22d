"""The Alembic history is the only way the schema is made: it must match the models."""

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from app.db import Base, make_engine
from app.migrate import downgrade, upgrade


def test_models_and_migrations_agree(engine):
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


def test_downgrade_to_base_and_back(database_url, tmp_path):
    # A separate database so the shared session engine keeps its schema.
    if database_url.startswith("sqlite"):
        url = f"sqlite:///{tmp_path / 'mig.db'}"
        scratch = make_engine(url)
    else:
        from tests.support.servers import create_pg_database

        name, url = create_pg_database("gpusched_mig")
        scratch = make_engine(url)
    try:
        upgrade(scratch)
        assert {"job", "allocation", "gpu", "api_token"} <= set(inspect(scratch).get_table_names())
        downgrade(scratch)
        assert set(inspect(scratch).get_table_names()) <= {"alembic_version"}
        upgrade(scratch)
        assert "job_event" in inspect(scratch).get_table_names()
    finally:
        scratch.dispose()
        if not database_url.startswith("sqlite"):
            from tests.support.servers import drop_pg_database

            drop_pg_database(name)
