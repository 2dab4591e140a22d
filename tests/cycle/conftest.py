"""A real Redis (valkey) for the drains' tests: their Lua scripts move what is taken
atomically, which a fake would only claim to do."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis as redis_lib

from app.cli.up import start_private_redis


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # As `gpusched up` starts it: on a port of the kernel's choosing, picked again if
    # another process takes it first.
    server, url = start_private_redis(tmp_path_factory.mktemp("redis"))
    try:
        yield url
    finally:
        server.stop()


@pytest.fixture
def redis(redis_server: str) -> Iterator[redis_lib.Redis]:
    """An empty database of the module's server."""
    client = redis_lib.Redis.from_url(redis_server)
    client.flushdb()
    yield client
    client.close()
