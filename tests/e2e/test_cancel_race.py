"""Cancelling a job while the scheduler places it must not leak its GPUs.

Found end-to-end (a GPU stayed allocated to a CANCELLED job for good, so later jobs never
got it): `app.jobs.control.cancel` reads the job without a row lock. When a cycle places
the job between that read and the cancel's commit, the cancel still takes the "pending"
path and writes CANCELLED over SCHEDULED. The placement's allocation stays active, the
agent's CANCELLED report is then ignored ("already CANCELLED"), and the GPU is never freed.

The interleaving is replayed here deterministically: the cancel's session reads the job
first, the cycle commits its placement, then the cancel runs in that same session.
"""

from __future__ import annotations

import os

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.auth.service import Principal, create_user
from app.cycle.run import run_cycle
from app.cycle.settings import SchedulerSettings
from app.db import utcnow
from app.jobs import control
from app.jobs.models import Job
from app.messaging import NullMessenger
from app.nodes.models import Allocation, Gpu
from app.projects.models import Project
from tests.foundation.builders import ready_node

pytestmark = pytest.mark.e2e

BACKEND = os.environ.get("GPUSCHED_TEST_DB", "sqlite")


@pytest.mark.skipif(
    BACKEND != "postgresql",
    reason="on SQLite every transaction takes the write lock when it begins, so a cancel "
    "and a placement cannot interleave at all (the scheduler would wait for the cancel)",
)
def test_cancel_racing_a_placement_does_not_leak_the_gpu(factory: sessionmaker[Session]) -> None:
    now = utcnow()
    with factory() as session:
        user, _ = create_user(
            session=session, name="u", projects=["p"], is_admin=False, ttl_days=0, actor="test"
        )
        project_id = session.scalar(select(Project.id).where(Project.name == "p"))
        node = ready_node("n1", gpus=1, now=now)
        session.add(node)
        job = Job(name="j", user_id=user.id, project_id=project_id, command="sleep 60", gpus=1)
        session.add(job)
        session.commit()
        job_id, user_id = job.id, user.id
    principal = Principal(
        user_id=user_id,
        name="u",
        is_admin=False,
        projects=frozenset({"p"}),
        project_ids=frozenset({project_id}),
    )

    with factory() as api_session:
        # The cancel request has read the job (PENDING) ...
        seen = api_session.get(Job, job_id)  # (kept: the identity map holds it weakly)
        assert seen is not None and seen.status == "PENDING"
        # ... when the scheduler places it and commits ...
        placed = run_cycle(
            factory=factory,
            messenger=NullMessenger(),
            holder="cycle",
            now=utcnow(),
            settings=SchedulerSettings(stability_window_s=0, preemption=False),
        )
        assert placed.placed == 1
        # ... and then the cancel goes on.
        out = control.cancel(session=api_session, principal=principal, job_id=job_id).value

    with factory() as session:
        job = session.get(Job, job_id)
        assert job is not None
        active = session.scalars(
            select(Allocation).where(Allocation.job_id == job_id, Allocation.released_at.is_(None))
        ).all()
        gpu = session.scalar(select(Gpu).where(Gpu.uuid == "GPU-n1-0"))
        assert gpu is not None
        state = (str(job.status), job.cancel_requested_at is not None, len(active))
        milli = gpu.allocated_milli
    # Right: the placement stands and the cancel becomes a stop request for the agent
    # (which then reports CANCELLED and frees the GPU). Wrong: CANCELLED while still
    # holding the GPU.
    assert out.status == "SCHEDULED" and out.cancel_requested
    assert state == ("SCHEDULED", True, 1)
    assert not (state[0] == "CANCELLED" and milli > 0), "GPU leaked to a cancelled job"
