"""Notification fixtures: the suite's settings with notifications allowed to this machine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.config import Settings
from tests.cli.conftest import cli  # noqa: F401  (the live-server CLI fixture)
from tests.notifications.receiver import Receiver


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        token_cache_s=0,
        notify_hosts="127.0.0.1",
    )


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
