"""X-Forwarded-For through a real `gpusched server` (uvicorn, as it is deployed): from a
peer the settings do not name as a proxy it is ignored, so rotating it does not reset the
failed-token limiter; from a named proxy it names the client."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from tests.support.servers import free_port
from tests.support.wait import poll
from tests.up_process import REPO

LIMIT = 5
BAD = {"Authorization": "Bearer gps_guess"}


def _serve(data_dir: Path, database_url: str, **env: str) -> Iterator[str]:
    port = free_port()
    own = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCHED_")}
    own.update(
        GPUSCHED_DATA_DIR=str(data_dir),
        GPUSCHED_DATABASE_URL=database_url,
        GPUSCHED_PORT=str(port),
        GPUSCHED_AUTH_FAILURES_PER_MINUTE=str(LIMIT),
        **env,
    )
    log = data_dir.parent / f"server-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "server", "--log-level", "warning"],
            cwd=REPO,
            env=own,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:

        def serving() -> bool:
            assert proc.poll() is None, log.read_text()
            return httpx.get(url + "/healthz", timeout=2).status_code == 200

        poll("the server", serving, on_timeout=log.read_text)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def server(
    tmp_path: Path, database_url: str, session_factory: sessionmaker[Session]
) -> Iterator[str]:
    yield from _serve(tmp_path / "data", database_url)


@pytest.fixture
def behind_proxy(
    tmp_path: Path, database_url: str, session_factory: sessionmaker[Session]
) -> Iterator[str]:
    yield from _serve(tmp_path / "data", database_url, GPUSCHED_TRUSTED_PROXIES="127.0.0.1")


def test_rotating_x_forwarded_for_from_an_untrusted_peer_does_not_reset_the_limiter(
    server: str, tmp_path: Path
) -> None:
    statuses = []
    for i in range(LIMIT + 3):
        headers = {**BAD, "X-Forwarded-For": f"192.0.2.{i}", "X-Real-IP": f"192.0.2.{i}"}
        statuses.append(httpx.get(server + "/api/v1/me", headers=headers).status_code)
    assert statuses == [401] * LIMIT + [429] * 3
    # The bootstrap admin's valid token is served all the same.
    token = (tmp_path / "data" / "admin.token").read_text().strip()
    r = httpx.get(server + "/api/v1/me", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200


def test_a_proxy_named_in_the_settings_forwards_the_client(behind_proxy: str) -> None:
    guesser = {**BAD, "X-Forwarded-For": "203.0.113.7"}
    statuses = [
        httpx.get(behind_proxy + "/api/v1/me", headers=guesser).status_code
        for _ in range(LIMIT + 1)
    ]
    assert statuses == [401] * LIMIT + [429]
    other = {"Authorization": "Bearer gps_other", "X-Forwarded-For": "198.51.100.9"}
    assert httpx.get(behind_proxy + "/api/v1/me", headers=other).status_code == 401
