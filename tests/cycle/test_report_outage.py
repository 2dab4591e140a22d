"""An agent's heartbeat that meets a database outage is dropped, not retried: applied
late, its old list of running attempts would make the scheduler declare attempts that
started since then lost (and stop them). Start and finish reports keep their retries."""

from __future__ import annotations

from app.config import Settings
from app.cycle.settings import SchedulerSettings
from app.messaging import AGENT_REPORT
from workers.scheduler import build_scheduler_app

# Nothing listens on port 1: every connection is refused, as while the database is down.
DATABASE_DOWN = "postgresql+psycopg://postgres@127.0.0.1:1/test"


def test_heartbeat_during_a_database_outage_is_dropped() -> None:
    celery = build_scheduler_app(Settings(database_url=DATABASE_DOWN), SchedulerSettings())
    heartbeat = {"kind": "heartbeat", "node": "n1", "gpus": [], "running": [], "recent": []}

    result = celery.tasks[AGENT_REPORT].apply(kwargs={"payload": heartbeat})

    assert result.successful(), result.traceback
    assert result.result == "dropped"
