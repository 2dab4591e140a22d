"""A seeded cluster for the security suite: a node, jobs of two projects, a window, a batch.

Everything is created through the real API where the API can create it (jobs, windows,
batches) and written to the database only where an agent would (node, attempt, log file),
once per test session (each xdist worker); each test gets it written back as new.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.engine import Engine

from app.auth.models import ApiToken, User
from app.auth.service import TOKEN_CACHE, issue_token, revoke_tokens
from app.config import Settings
from app.cycle.run import run_cycle
from app.cycle.settings import SchedulerSettings
from app.db import make_session_factory, utcnow
from app.jobs.allocations import GpuClaim, allocate
from app.jobs.lifecycle import transition
from app.jobs.models import Job
from app.jobs.states import JobStatus
from app.messaging import NullMessenger
from app.nodes.models import Gpu, Node, NodeState
from tests.conftest import Api, open_api
from tests.foundation.builders import add_node
from tests.support.servers import copy_tables, restore_tables, wipe_tables

# Appears in every field of project ml's rows: no response to another project may carry it.
ML_MARKER = "mlprivate7f3a"
WINDOW = {
    "name": "night",
    "timezone": "Europe/Berlin",
    "daily": [{"start": "22:00", "end": "06:00"}],
    "capacity_outside_fraction": 0.5,
}
BATCH = {
    "name": "nightly",
    "cron": "0 2 * * *",
    "timezone": "UTC",
    "templates": [{"command": ["python", f"{ML_MARKER}-nightly.py"], "gpus": 1}],
}
ML_JOB = {
    "command": ["python", f"{ML_MARKER}-train.py"],
    "script": f"#!/bin/sh\necho {ML_MARKER}\n",  # its text at submission: ml's too
    "name": f"{ML_MARKER}-pending",
    "labels": {"team": ML_MARKER},
    "env": {"ML_SECRET": ML_MARKER},
}
LOG_TEXT = f"step 1 loss 2.0 {ML_MARKER}\nstep 2 loss 1.5\n"
CANARY_TEXT = "CANARY-SECRET-must-never-be-served"


@dataclass
class Cluster:
    api: Api
    settings: Settings
    node: str = "n1"
    retired_node: str = "n0-old"  # NOT_READY, holding nothing: one an admin may remove
    ml_job: int = 0  # alice's, PENDING
    ml_running_job: int = 0  # alice's, RUNNING, attempt 1 with a log file
    ml_array: int = 0  # alice's job array (its first task's id), PENDING
    cv_job: int = 0  # bob's
    window: str = WINDOW["name"]
    batch: str = BATCH["name"]
    member: str = "dana"  # in projects ml and cv: the user routes' seeded user
    canaries: list[Path] = field(default_factory=list)

    def headers(self, user: str) -> dict[str, str]:
        return self.api.as_(user)


def running_job(
    api: Api, *, user: str = "alice", body: dict[str, Any] | None = None, gpu: int = 0
) -> int:
    """A job moved to RUNNING attempt 1 on GPU `gpu` of node 1, as the scheduler would."""
    payload = {"command": ["train"], **(body or {}), "gpus": 1}
    r = api.client.post("/api/v1/jobs", json=payload, headers=api.as_(user))
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    with api.factory() as session:
        job = session.get(Job, job_id)
        job.attempt = 1
        transition(session, job=job, to=JobStatus.SCHEDULED, actor="test")
        gpu_id = session.scalar(select(Gpu.id).where(Gpu.index == gpu).order_by(Gpu.id))
        allocate(
            session, job=job, claims=[GpuClaim(node_id=1, gpu_id=gpu_id, share_milli=1000, rank=0)]
        )
        transition(session, job=job, to=JobStatus.RUNNING, actor="test")
        session.commit()
    return job_id


def plant_canaries(settings: Settings) -> list[Path]:
    """Files next to (and above) the log directory that no request may ever return."""
    log_dir = settings.log_dir.resolve()
    log_dir.mkdir(parents=True, exist_ok=True)
    paths = [
        log_dir.parent / "canary.txt",
        log_dir / "canary.log",
        log_dir / "attempt-1.log",
        log_dir.parent / "1" / "attempt-1.log",
        log_dir / "0" / "attempt-1.log",
    ]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(CANARY_TEXT + "\n")
    return paths


def _seed(api: Api, settings: Settings) -> Cluster:
    add_node(api.factory, "n1", gpus=8)
    world = Cluster(api=api, settings=settings)
    add_node(api.factory, world.retired_node, gpus=1, state=NodeState.NOT_READY)
    r = api.client.post("/api/v1/jobs", json=ML_JOB, headers=api.as_("alice"))
    assert r.status_code == 201, r.text
    world.ml_job = r.json()["id"]
    world.ml_running_job = running_job(api, body={**ML_JOB, "name": f"{ML_MARKER}-running"})
    sweep = {**ML_JOB, "name": f"{ML_MARKER}-sweep", "array": {"indices": "0-1"}}
    r = api.client.post("/api/v1/jobs", json=sweep, headers=api.as_("alice"))
    assert r.status_code == 201, r.text
    world.ml_array = r.json()["id"]
    r = api.client.post("/api/v1/jobs", json={"command": "echo cv"}, headers=api.as_("bob"))
    assert r.status_code == 201, r.text
    world.cv_job = r.json()["id"]
    r = api.client.post("/api/v1/windows", json=WINDOW, headers=api.as_("admin"))
    assert r.status_code == 201, r.text
    r = api.client.post("/api/v1/batches", json=BATCH, headers=api.as_("alice"))
    assert r.status_code == 201, r.text
    api.add_user(world.member, ["ml", "cv"])
    _rank_without_placing(api)
    return world


@dataclass(frozen=True)
class _Seeded:
    world: Cluster
    tokens: dict[str, str]
    rows: dict[str, list[dict[str, Any]]]
    at: datetime


@pytest.fixture(scope="session")
def _seeded(engine: Engine, database_url: str, tmp_path_factory: pytest.TempPathFactory) -> _Seeded:
    """The cluster built once per test session (each xdist worker), through the API as
    `cluster` describes, and its database copied: building it for each of the suite's
    few hundred tests cost most of their time."""
    wipe_tables(engine)
    TOKEN_CACHE.clear()
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("seed") / "data", database_url=database_url,
        token_cache_s=0,
    )  # fmt: skip
    with open_api(settings, make_session_factory(engine)) as api:
        world = _seed(api, settings)
        return _Seeded(world, dict(api.tokens), copy_tables(engine), utcnow())


@pytest.fixture
def cluster(api: Api, settings: Settings, engine: Engine, _seeded: _Seeded) -> Cluster:
    """The seeded cluster, as new: its database written back (times moved to now), this
    test's API holding its users' tokens, the running job's log and the canaries in this
    test's log directory."""
    restore_tables(engine, _seeded.rows, shift=utcnow() - _seeded.at)
    TOKEN_CACHE.clear()
    api.tokens = dict(_seeded.tokens)
    world = replace(_seeded.world, api=api, settings=settings, canaries=[])
    log = settings.log_dir.resolve() / str(world.ml_running_job) / "attempt-1.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(LOG_TEXT)
    world.canaries = plant_canaries(settings)
    return world


def _rank_without_placing(api: Api) -> None:
    """One full cycle with the nodes drained, as a scheduler leaves the queue: its waiting
    jobs ranked (GET /jobs/{id}/rank answers from that), none placed."""
    with api.factory.begin() as session:
        session.execute(update(Node).values(drained=True))
    run_cycle(
        factory=api.factory,
        messenger=NullMessenger(),
        settings=SchedulerSettings(),
        holder="test",
        now=utcnow(),
    )
    with api.factory.begin() as session:
        session.execute(update(Node).values(drained=False))


def expired_token(api: Api, user: str = "alice") -> str:
    with api.factory() as session:
        row_user = session.scalar(select(User).where(User.name == user))
        token = issue_token(
            session=session, user=row_user, ttl_days=1, label="expired", actor="test"
        )
        row = session.scalar(select(ApiToken).order_by(ApiToken.id.desc()))
        row.expires_at = utcnow() - timedelta(seconds=1)
        session.commit()
    return token


def revoked_token(api: Api, user: str) -> str:
    """A fresh user's token, then revoked (the other users keep theirs)."""
    token = api.add_user(user, ["ml"])
    with api.factory() as session:
        assert revoke_tokens(session=session, user_name=user, actor="test") == 1
        session.commit()
    return token
