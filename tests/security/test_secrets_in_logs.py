"""Tokens never reach a log, and validation errors never echo a submitted env value.

The app is served by a real uvicorn (in a thread, on a free port, uvicorn's own logging
config as `gpusched server` uses it, at debug level) while every logger of the process is
captured at DEBUG, and the process's stdout/stderr (uvicorn's access log) too.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from sqlalchemy.orm import Session, sessionmaker

from app.auth.service import TOKEN_CACHE, revoke_tokens
from app.config import Settings
from app.main import create_app
from tests.foundation.builders import add_user
from tests.security.conftest import expired_token
from tests.support.servers import free_port
from tests.support.wait import poll

ENV_SECRET = "envsecret-93be1c0d"
SQL_ECHO = "sqlalchemy.engine"


class CaptureAll(logging.Handler):
    """Every record of every logger, formatted with its arguments and traceback."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.records: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.name, self.format(record)))

    def text(self, *, sql_echo: bool) -> str:
        """SQLAlchemy's statement echo (sqlalchemy.engine, off unless an operator turns it
        on) is kept apart: it is checked by its own test."""
        return "\n".join(
            line for name, line in self.records if name.startswith(SQL_ECHO) == sql_echo
        )


@contextlib.contextmanager
def all_logging_at_debug() -> Iterator[CaptureAll]:
    handler = CaptureAll()
    manager = logging.Logger.manager
    loggers = [logging.getLogger()] + [
        logger for logger in manager.loggerDict.values() if isinstance(logger, logging.Logger)
    ]
    saved = [(logger, logger.level, logger.disabled) for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.DEBUG)
        logger.disabled = False
        logger.addHandler(handler)  # also on non-propagating ones (uvicorn.access)
    try:
        yield handler
    finally:
        for logger, level, disabled in saved:
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.disabled = disabled


@contextlib.contextmanager
def serve(app) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="debug"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    poll("uvicorn to start", lambda: server.started or not thread.is_alive(), interval=0.02)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def scenario(
    settings: Settings, session_factory: sessionmaker[Session]
) -> tuple[CaptureAll, dict[str, str]]:
    """Create users, authenticate with good, cached, wrong, expired, revoked and malformed
    tokens, submit jobs (one invalid), and get rate limited; return the captured logs and
    the tokens used."""
    # A token cache period > 0 so the cache path is exercised too; the limiter low so 429 is.
    settings = settings.model_copy(update={"token_cache_s": 5.0, "auth_failures_per_minute": 8})
    with all_logging_at_debug() as captured:
        admin = add_user(session_factory, "admin", ["default"], admin=True)
        alice = add_user(session_factory, "alice", ["ml"])
        carol = add_user(session_factory, "carol", ["ml"])
        from tests.conftest import Api

        expired = expired_token(Api(None, session_factory), "alice")  # type: ignore[arg-type]
        with session_factory() as session:
            revoke_tokens(session=session, user_name="carol", actor="test")
            session.commit()
        TOKEN_CACHE.clear()
        wrong = "gps_" + "x" * 43
        app = create_app(settings, session_factory=session_factory)
        with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:

            def bearer(token: str) -> dict[str, str]:
                return {"Authorization": f"Bearer {token}"}

            assert client.get("/api/v1/me", headers=bearer(admin)).status_code == 200
            assert client.get("/api/v1/me", headers=bearer(alice)).status_code == 200
            assert client.get("/api/v1/me", headers=bearer(alice)).status_code == 200  # cached
            r = client.post(
                "/api/v1/jobs",
                json={"command": ["true"], "env": {"KEY": ENV_SECRET}},
                headers=bearer(alice),
            )
            assert r.status_code == 201, r.text
            r = client.post(
                "/api/v1/jobs",
                json={"command": ["true"], "env": {"KEY": ENV_SECRET, "bad name": ENV_SECRET}},
                headers=bearer(alice),
            )
            assert r.status_code == 422
            for token in (wrong, expired, carol, f"{alice}x", alice[:-1]):
                assert client.get("/api/v1/jobs", headers=bearer(token)).status_code == 401
            r = client.get("/api/v1/jobs", headers={"Authorization": f"Basic {alice}"})
            assert r.status_code == 401
            statuses = [
                client.get("/api/v1/jobs", headers=bearer(wrong)).status_code for _ in range(4)
            ]
            assert statuses[-1] == 429, statuses
    tokens = {
        "admin": admin,
        "alice": alice,
        "carol (revoked)": carol,
        "expired": expired,
        "wrong": wrong,
    }
    return captured, tokens


def leaks(text: str, tokens: dict[str, str]) -> list[str]:
    found = []
    for label, token in tokens.items():
        for form, value in (
            ("token", token),
            ("sha256", hashlib.sha256(token.encode()).hexdigest()),
            ("token without prefix", token.removeprefix("gps_")),
        ):
            if value in text:
                line = next(line for line in text.splitlines() if value in line)
                found.append(f"{label} {form}: {line[:200]}")
    if ENV_SECRET in text:
        found.append("env value: " + next(ln for ln in text.splitlines() if ENV_SECRET in ln))
    return found


def test_no_token_or_token_hash_in_any_log(
    settings: Settings, session_factory: sessionmaker[Session], capfd: pytest.CaptureFixture
) -> None:
    captured, tokens = scenario(settings, session_factory)
    out, err = capfd.readouterr()
    text = "\n".join([captured.text(sql_echo=False), out, err])
    assert "GET /api/v1/me" in text  # uvicorn's access log was captured
    assert "gpusched" in text or "uvicorn" in text
    assert leaks(text, tokens) == []


def test_sql_echo_shows_no_token_hash_or_env_value(
    settings: Settings, session_factory: sessionmaker[Session]
) -> None:
    captured, tokens = scenario(settings, session_factory)
    # Statement echo (INFO) must hide bound values. Result rows are printed only at DEBUG,
    # SQLAlchemy's "echo=debug" for debugging queries, which shows data by design.
    text = "\n".join(
        line for line in captured.text(sql_echo=True).splitlines() if " DEBUG Row " not in line
    )
    assert "SELECT" in text  # the echo was on
    assert leaks(text, tokens) == []


@pytest.mark.parametrize(
    "body",
    [
        {"command": ["true"], "env": {"bad name": ENV_SECRET}},
        {"command": ["true"], "env": {"CUDA_VISIBLE_DEVICES": ENV_SECRET}},
        {"command": ["true"], "env": {"K": ENV_SECRET * 2000}},  # over max_length
        {"command": ["true"], "env": {"K": [ENV_SECRET]}},  # wrong type
        {"command": ["true"], "env": {"K": ENV_SECRET}, "gpus": -1},
        {"command": ["true"], "env": {"K": ENV_SECRET}, "unknown": ENV_SECRET},
        {"command": ["true"], "env": {"K": ENV_SECRET}, "project": "nope"},  # FieldError
        {"command": [], "env": {"K": ENV_SECRET}},
        {"command": ["true"], "env": ENV_SECRET},
    ],
)
def test_validation_errors_never_echo_env_values(api, body) -> None:
    r = api.client.post("/api/v1/jobs", json=body, headers=api.as_("alice"))
    assert r.status_code == 422, r.text
    assert ENV_SECRET not in r.text, r.text
    for error in r.json()["errors"]:
        assert "input" not in error and "ctx" not in error, error


def test_undecodable_json_with_an_env_value_is_not_echoed(api) -> None:
    raw = b'{"command": ["true"], "env": {"K": "' + ENV_SECRET.encode() + b'"'
    r = api.client.post(
        "/api/v1/jobs",
        content=raw,
        headers={**api.as_("alice"), "Content-Type": "application/json"},
    )
    assert r.status_code == 422 and ENV_SECRET not in r.text, r.text


def test_batch_template_errors_never_echo_env_values(api) -> None:
    body = {
        "name": "b",
        "cron": "0 2 * * *",
        "templates": [{"command": ["true"], "env": {"bad name": ENV_SECRET}, "gpus": 1}],
    }
    r = api.client.post("/api/v1/batches", json=body, headers=api.as_("alice"))
    assert r.status_code == 422 and ENV_SECRET not in r.text, r.text
    body["templates"] = [{"command": ["true"], "env": {"K": ENV_SECRET}, "project": "nope"}]
    r = api.client.post("/api/v1/batches", json=body, headers=api.as_("alice"))
    assert r.status_code == 422 and ENV_SECRET not in r.text, r.text
