"""CLI fixtures: the real app served by uvicorn on a loopback port, and a CliRunner wrapper.

The server runs in a background thread on a socket bound here (port 0), so there is no race
for a free port; `should_exit` stops it after the test.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
import uvicorn
from fastapi import FastAPI
from sqlalchemy.orm import Session, sessionmaker

from app.config import Settings
from tests.cli.harness import Cli
from tests.support.apps import fresh_app
from tests.support.wait import poll


def serve_in_thread(app: FastAPI) -> tuple[str, uvicorn.Server, threading.Thread, socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # log_config=None: leave the process's logging alone (CliRunner swaps stderr per call).
    config = uvicorn.Config(
        app, log_config=None, log_level="warning", access_log=False, lifespan="off"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    poll("uvicorn to start", lambda: server.started or not thread.is_alive(), interval=0.01)
    if not server.started:
        raise RuntimeError("uvicorn did not start")
    return f"http://127.0.0.1:{port}", server, thread, sock


@pytest.fixture
def cli(
    settings: Settings, session_factory: sessionmaker[Session], database_url: str
) -> Iterator[Cli]:
    """A live server with users admin (project default), alice (ml) and bob (cv)."""
    url, server, thread, sock = serve_in_thread(
        fresh_app(settings, session_factory=session_factory)
    )
    cli = Cli(url=url, settings=settings, database_url=database_url, factory=session_factory)
    cli.add_user("admin", ["default"], admin=True)
    cli.add_user("alice", ["ml"])
    cli.add_user("bob", ["cv"])
    try:
        yield cli
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A loopback URL where nothing listens: the port is held (bound, never listening), so no
    other process can take it during the test, and a connect is refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()
