"""Batch fixtures: users in projects, and helpers to create schedules at an injected time."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.auth.models import User
from app.auth.service import Principal
from app.batches import service
from app.batches.models import BatchFiring
from app.batches.schemas import BatchIn
from app.cycle.run import run_cycle
from app.db import utcnow
from app.jobs.limits import RuntimeLimits
from app.jobs.models import Job
from app.messaging import NullMessenger
from tests.cli.conftest import cli  # noqa: F401  (the live-server CLI fixture)
from tests.cycle.jobs_api import SETTINGS
from tests.foundation.builders import add_user, ready_node


@dataclass
class World:
    factory: sessionmaker[Session]
    limits: RuntimeLimits = field(default_factory=RuntimeLimits)  # none by default

    def user(self, name: str, projects: list[str], *, admin: bool = False) -> Principal:
        add_user(self.factory, name, projects, admin=admin)
        return self.principal(name)

    def principal(self, name: str) -> Principal:
        with self.factory() as session:
            user_id = session.scalar(select(User.id).where(User.name == name))
            assert user_id is not None
            return service.owner_principal(session=session, user_id=user_id)

    def create(self, owner: Principal, now: datetime, **fields: Any) -> int:
        body: dict[str, Any] = {
            "name": "nightly",
            "cron": "0 2 * * *",
            "timezone": "UTC",
            "templates": [{"command": ["python", "train.py"], "gpus": 1}],
        }
        body.update(fields)
        with self.factory() as session:
            out = service.create_batch(
                session=session,
                principal=owner,
                body=BatchIn.model_validate(body),
                limits=self.limits,
                now=now,
            )
        return out.id

    def fire(self, now: datetime, **kwargs: Any) -> service.FireReport:
        return service.fire_due(factory=self.factory, limits=self.limits, now=now, **kwargs)

    def firings(self, schedule_id: int | None = None) -> list[BatchFiring]:
        with self.factory() as session:
            query = select(BatchFiring).order_by(BatchFiring.fire_at)
            if schedule_id is not None:
                query = query.where(BatchFiring.schedule_id == schedule_id)
            return list(session.scalars(query))

    def replacing_batch_with_a_placed_job(self, owner: Principal) -> tuple[int, int]:
        """A `replace` batch fired once on a 1-GPU node: its first job placed, its second
        waiting. Returns their ids."""
        with self.factory.begin() as session:
            session.add(ready_node("n1", gpus=1, now=utcnow()))
        templates = [{"command": ["train"]}, {"command": ["eval"]}]
        self.create(
            owner, datetime(2026, 1, 1, tzinfo=UTC), templates=templates, concurrency="replace"
        )
        placed, waiting = self.fire(datetime(2026, 1, 1, 2, 0, 1, tzinfo=UTC)).submitted_jobs
        run_cycle(
            factory=self.factory,
            messenger=NullMessenger(),
            settings=SETTINGS,
            holder="t",
            now=utcnow(),
        )
        return placed, waiting

    def jobs(self) -> list[Job]:
        with self.factory() as session:
            return list(session.scalars(select(Job).order_by(Job.id)))


@pytest.fixture
def world(session_factory: sessionmaker[Session]) -> Iterator[World]:
    yield World(session_factory)


@pytest.fixture
def alice(world: World) -> Principal:
    return world.user("alice", ["ml"])
