"""An agent's heartbeat that meets a database outage is dropped, not retried: applied
late, its old list of running attempts would make the scheduler declare attempts that
started since then lost (and stop them). Start and finish reports keep their retries."""

from __future__ import annotations

from app.db import make_engine, make_session_factory, utcnow
from app.nodes.telemetry import TelemetryPolicy
from workers.scheduler import handle_heartbeat

# Nothing listens on port 1: every connection is refused, as while the database is down.
DATABASE_DOWN = "postgresql+psycopg://postgres@127.0.0.1:1/test"


def test_heartbeat_during_a_database_outage_is_dropped() -> None:
    factory = make_session_factory(make_engine(DATABASE_DOWN))
    heartbeat = {"kind": "heartbeat", "node": "n1", "gpus": [], "running": [], "recent": []}

    with factory() as session:
        repairs = handle_heartbeat(
            session=session,
            payload=heartbeat,
            telemetry=TelemetryPolicy(),
            grace_s=15,
            now=utcnow(),
        )

    assert repairs is None
