"""The private Redis `gpusched up` and the tests start (app/cli/up.py): on a port the
kernel picks, picked again when another process takes it before the server binds it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import redis as redis_lib

from app.cli import up


def test_a_port_taken_before_the_server_binds_it_is_picked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        taken_port = taken.getsockname()[1]
        picks = [taken_port]
        real_pick = up._os_free_port
        monkeypatch.setattr(up, "_os_free_port", lambda: picks.pop() if picks else real_pick())
        server, url = up.start_private_redis(tmp_path / "redis")
        try:
            assert server.port != taken_port
            assert redis_lib.Redis.from_url(url).ping()
        finally:
            server.stop()


def test_a_port_asked_for_is_not_changed(tmp_path: Path) -> None:
    # A restart keeps the port its clients know: taken, it is an error, not another port.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(Exception, match="already in use"):
            up.start_private_redis(tmp_path / "redis", port=taken.getsockname()[1])
