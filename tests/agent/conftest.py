from __future__ import annotations

from collections.abc import Iterator

import pytest

from workers.agent import forkserver


@pytest.fixture(autouse=True)
def _no_fork_server_outlives_its_test() -> Iterator[None]:
    # Each test's agent has an installation of its own, so a fork server of its own.
    yield
    forkserver.stop_all()
