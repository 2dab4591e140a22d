"""The e2e stack's metrics ports (tests/support/stack.py FREE_PORT): picked when the stack
is made, and found lost when another server holds one, so that the fixture starts the
stack anew instead of a test reading someone else's port."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import start_http_server

from tests.support.stack import FREE_PORT, Proc, Stack

PORT = "GPUSCHED_SCHEDULER_REPORTS_METRICS_PORT"


def _stack(tmp_path: Path) -> Stack:
    return Stack(tmp_path, env={PORT: FREE_PORT}, reports_env=[{PORT: FREE_PORT}])


@pytest.fixture
def closing_server() -> Iterator[int]:
    """A port whose server closes every connection unanswered (not a metrics server)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            connection.close()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def test_free_ports_are_picked_when_the_stack_is_made(tmp_path: Path) -> None:
    stack = _stack(tmp_path)
    picked = [int(stack.env_overrides[PORT]), int(stack.reports_env[0][PORT])]
    assert stack.picked_ports == picked
    assert all(port > 0 for port in picked)


def test_a_picked_port_served_with_metrics_is_not_lost(tmp_path: Path) -> None:
    stack = _stack(tmp_path)
    servers = [start_http_server(port, addr="127.0.0.1") for port in stack.picked_ports]
    try:
        assert stack.picked_port_lost(timeout=10) is None
    finally:
        for server, _ in servers:
            server.shutdown()
            server.server_close()


def test_a_picked_port_that_another_server_answers_is_lost(
    tmp_path: Path, closing_server: int
) -> None:
    stack = _stack(tmp_path)
    stack.picked_ports = [closing_server]
    lost = stack.picked_port_lost(timeout=10)
    assert lost is not None and str(closing_server) in lost


def test_a_picked_port_its_process_could_not_bind_is_lost(tmp_path: Path) -> None:
    stack = _stack(tmp_path)
    port = stack.picked_ports[1]
    log = tmp_path / "reports.log"
    log.write_text(f"WARNING reports metrics not served on port {port}: [Errno 98] in use\n")
    stack.procs["reports"] = Proc(label="reports", argv=[], log=log)
    lost = stack.picked_port_lost(timeout=10)
    assert lost is not None and lost.startswith("reports: ") and str(port) in lost
