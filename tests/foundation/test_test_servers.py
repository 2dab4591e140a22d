"""The test run's own PostgreSQL (tests/support/servers.py) goes away with the run, however
the run ends: a run killed outright must not leave a server behind for every later run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.support.servers import PG_DURABLE_ENV, PrivatePostgres
from tests.support.wait import poll

REPO = Path(__file__).resolve().parents[2]
STARTER = """
import sys, time
from tests.support.servers import PrivatePostgres
pg = PrivatePostgres().start()
print(pg.url, pg.dir, flush=True)
time.sleep(600)
"""


def _answers(url: str) -> bool:
    engine = create_engine(url, connect_args={"connect_timeout": 2})
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT 1")).scalar() == 1
    except Exception:
        return False
    finally:
        engine.dispose()


DURABILITY = ("fsync", "synchronous_commit", "full_page_writes")


def _durability(url: str) -> dict[str, str]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return {name: conn.execute(text(f"SHOW {name}")).scalar_one() for name in DURABILITY}
    finally:
        engine.dispose()


def test_a_private_server_answers_and_is_removed_by_cleanup() -> None:
    pg = PrivatePostgres().start()
    try:
        assert _answers(pg.url)
        # The tests' server trades durability for speed.
        assert _durability(pg.url) == dict.fromkeys(DURABILITY, "off")
        pg.stop()
        assert not _answers(pg.url)
        pg.start()  # a fault test stops and starts it: the data is kept
        assert _answers(pg.url)
    finally:
        pg.cleanup()
    assert not pg.dir.exists()
    assert not _answers(pg.url)


def test_a_benchmarks_server_flushes_each_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A benchmark measures what a deployment gets (bench/common.py durable_postgres)."""
    monkeypatch.setenv(PG_DURABLE_ENV, "1")
    pg = PrivatePostgres().start()
    try:
        assert _durability(pg.url) == dict.fromkeys(DURABILITY, "on")
    finally:
        pg.cleanup()


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_a_killed_run_takes_its_server_with_it() -> None:
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert starter.stdout is not None
        url, directory = starter.stdout.readline().split()
        assert _answers(url)
        starter.send_signal(signal.SIGKILL)
        starter.wait()
        poll("the guard to stop the server", lambda: not _answers(url))
        poll("the guard to remove its files", lambda: not Path(directory).exists())
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait()
