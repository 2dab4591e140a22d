"""What a worker process needs at run time, built once per process from settings."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import redis
from celery import Celery
from sqlalchemy.orm import Session, sessionmaker

from app.config import Settings
from app.db import make_engine, make_session_factory
from app.messaging import Messenger, create_celery
from app.nodes.keys import NodeKeys


@dataclass
class Runtime:
    settings: Settings
    # How long a run_job waits in a node's queue before it is dropped (see Messenger).
    run_expires_s: float | None = None

    @cached_property
    def celery(self) -> Celery:
        return create_celery(self.settings.redis_url)

    @cached_property
    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.settings.redis_url, socket_timeout=5)

    @cached_property
    def node_keys(self) -> NodeKeys:
        return NodeKeys(self.factory)

    @cached_property
    def messenger(self) -> Messenger:
        return Messenger(
            self.celery, self.redis, keys=self.node_keys, run_expires_s=self.run_expires_s
        )

    @cached_property
    def factory(self) -> sessionmaker[Session]:
        return make_session_factory(make_engine(self.settings.effective_database_url))
