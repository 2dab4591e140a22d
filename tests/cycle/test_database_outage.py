"""Scheduler work that meets a database outage (nothing listens on the database port).

- A heartbeat is dropped, not retried: applied late, its old list of running attempts
  would make the scheduler declare attempts that started since then lost (and stop
  them). Start and finish reports keep their retries.
- A reconcile run that fails interrupts the silence judge: no heartbeat could be stored
  meanwhile, so silence must not count against nodes right after the database is back.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from app.cycle.reconcile import SilenceJudge, reconcile
from app.db import make_engine, make_session_factory
from app.nodes.telemetry import TelemetryPolicy
from app.wire import Heartbeat
from workers.heartbeats import handle_heartbeat

# Nothing listens on port 1: every connection is refused, as while the database is down.
DATABASE_DOWN = "postgresql+psycopg://postgres@127.0.0.1:1/test"
T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def _session() -> Session:
    return make_session_factory(make_engine(DATABASE_DOWN))()


def test_heartbeat_during_a_database_outage_is_dropped() -> None:
    heartbeat = Heartbeat(node="n1")

    with _session() as session:
        repairs = handle_heartbeat(
            session=session, heartbeat=heartbeat, telemetry=TelemetryPolicy(), grace_s=15, now=T0
        )

    assert repairs is None


def test_a_failed_reconcile_run_restarts_the_silence_grace() -> None:
    judge = SilenceJudge(heartbeat_timeout_s=3)
    for s in range(3):
        judge.may_judge(T0 + timedelta(seconds=s))
    assert judge.may_judge(T0 + timedelta(seconds=3))  # 3 s of runs: silence counts

    with _session() as session, pytest.raises(OperationalError):
        reconcile(
            session=session,
            now=T0 + timedelta(seconds=4),
            heartbeat_timeout_s=3,
            dispatch_timeout_s=15,
            silence=judge,
        )

    assert not judge.may_judge(T0 + timedelta(seconds=5))
    assert judge.may_judge(T0 + timedelta(seconds=8))
