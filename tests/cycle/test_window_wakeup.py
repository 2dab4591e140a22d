"""A live cycle says when the next one is due for an off-peak window: when it opens for a
waiting job, and when a running preemptible job must be stopped its grace period before
it closes. The scheduler worker arms a timed cycle for that instant (`CycleReport.wake_at`),
so neither waits for the next beat. The cycles here run at chosen instants, not the clock's.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import update

from app.cycle.run import CycleReport, run_cycle
from app.db import utcnow
from app.jobs.models import Job
from app.jobs.states import JobStatus
from app.messaging import NullMessenger
from tests.cycle.jobs_api import SETTINGS, get_job, submit
from tests.foundation.builders import ready_node

GRACE_S = 10
OPEN_S = 15  # the window opens at every minute for 15 s


def _cycle(api, now: datetime) -> CycleReport:
    return run_cycle(
        factory=api.factory, messenger=NullMessenger(), settings=SETTINGS, holder="t", now=now
    )


def test_cycles_are_due_when_the_window_opens_and_a_grace_before_it_closes(api) -> None:
    r = api.client.post(
        "/api/v1/windows",
        json={"name": "minutely", "timezone": "UTC", "cron": "* * * * *", "duration_s": OPEN_S},
        headers=api.as_("admin"),
    )
    assert r.status_code == 201, r.text
    # The next minute after the submission, so that every cycle runs after it.
    opens = (utcnow() + timedelta(minutes=1)).replace(second=0, microsecond=0)
    with api.factory.begin() as session:
        session.add(ready_node("n1", gpus=1, now=opens))
    job = submit(
        api,
        gpus=1,
        preemptible=True,
        grace_s=GRACE_S,
        schedule={"mode": "offpeak", "window": "minutely"},
    )

    # Before the opening: the job waits for the window, and the next cycle is due as it opens.
    waiting = _cycle(api, opens - timedelta(seconds=20))
    assert get_job(api, job["id"])["pending_reason"] == "window_closed"
    assert waiting.wake_at == opens

    assert _cycle(api, opens).placed == 1
    with api.factory.begin() as session:
        session.execute(update(Job).where(Job.id == job["id"])
                        .values(status=JobStatus.RUNNING, started_at=opens))  # fmt: skip

    # Running: the next cycle is due when the job must get SIGTERM so that its grace ends
    # by the close (opens + 15 s - 10 s); no other cycle would come before the next beat.
    running = _cycle(api, opens + timedelta(seconds=1))
    assert running.preempted == 0
    assert running.wake_at == opens + timedelta(seconds=OPEN_S - GRACE_S)

    # And that cycle is the one that stops it.
    assert _cycle(api, running.wake_at).preempted == 1
