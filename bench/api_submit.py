"""API submission benchmark: accepted submissions/s and latency, then GET /api/v1/jobs.

Starts the API (uvicorn, several workers) against a fresh PostgreSQL database, submits jobs
from concurrent clients for a fixed time, and prints a table. No scheduler or agent runs,
so this measures the API and database path only.

    .venv/bin/python bench/api_submit.py [--clients 32] [--seconds 10] [--workers 2] [--keep-alive]
        [--queued N]

`--queued N`: the submitting user already has N jobs pending (inserted in bulk first; the
per-user limit raised to let the run's own through), as on a cluster with a deep queue.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import durable_postgres  # noqa: E402
from tests.support.servers import create_pg_database, drop_pg_database, free_port  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class Connection:
    """An HTTP/1.1 client connection that sends pre-encoded requests and reads each
    response's status and body: the load generator shares the machine's two cores with
    the server, and httpx's client spends about one core on 200 requests/s, which would
    measure the client instead of the API.

    By default it connects anew for every request, as each `gpusched submit` and cron run
    does; this also spreads requests over uvicorn's workers as real clients do (32
    keep-alive connections opened at once may all land on one worker). `keep_alive`
    reuses one connection, as an SDK would."""

    def __init__(self, host: str, port: int, token: str, *, keep_alive: bool) -> None:
        self.host, self.port, self.keep_alive = host, port, keep_alive
        self.headers = f"Host: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes = b"") -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = f"{method} {path} HTTP/1.1\r\n{self.headers}"
        if body:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + body)
        lines = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next(
            int(line.split(":", 1)[1])
            for line in lines
            if line.lower().startswith("content-length:")
        )
        await self.reader.readexactly(length)
        if not self.keep_alive:
            await self.close()
        return status

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()
            self.reader = self.writer = None


# One request by client `i`, its `n`-th: returns the HTTP status.
MakeRequest = Callable[[Connection, int, int], Awaitable[int]]


async def hammer(
    url: str,
    token: str,
    *,
    clients: int,
    seconds: float,
    keep_alive: bool,
    make_request: MakeRequest,
) -> dict[str, Any]:
    latencies: list[float] = []
    errors: Counter[int] = Counter()  # by HTTP status
    deadline = time.perf_counter() + seconds
    host, port = url.removeprefix("http://").split(":")

    async def client(i: int) -> None:
        conn = Connection(host, int(port), token, keep_alive=keep_alive)
        n = 0
        try:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                status = await make_request(conn, i, n)
                if status in (200, 201):
                    latencies.append(time.perf_counter() - started)
                else:
                    errors[status] += 1
                n += 1
        finally:
            await conn.close()

    began = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    elapsed = time.perf_counter() - began
    return {
        "ok": len(latencies),
        "errors": sum(errors.values()),
        "error_statuses": dict(errors),
        "per_s": len(latencies) / elapsed,
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
    }


def queue_jobs(db_url: str, count: int) -> None:
    """`count` pending jobs of the admin (the benchmark's user), in bulk."""
    from sqlalchemy import text

    import app.models  # noqa: F401  (every table, for the ORM's foreign keys)
    from app.db import make_engine, make_session_factory
    from tests.foundation.builders import insert_jobs

    engine = make_engine(db_url)
    insert_jobs(make_session_factory(engine), user="admin", project="default", count=count)
    with engine.begin() as conn:
        conn.execute(text("ANALYZE"))  # as autovacuum would within a minute of the inserts
    engine.dispose()


def main() -> int:
    durable_postgres()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--keep-alive", action="store_true", help="one connection per client, not per request"
    )
    parser.add_argument("--queued", type=int, default=0, help="jobs pending before the run")
    args = parser.parse_args()

    db_name, db_url = create_pg_database("gpusched_bench")
    data_dir = Path(tempfile.mkdtemp(prefix="gpusched-bench-"))
    port = free_port()
    env = {**os.environ, "GPUSCHED_DATABASE_URL": db_url, "GPUSCHED_DATA_DIR": str(data_dir)}
    env.pop("GPUSCHED_REDIS_URL", None)  # no scheduler here: nothing to notify
    # Throughput, not the per-user cap (10,000 pending by default): 32 clients at 1,000/s
    # reach it within ten seconds, and the rest would be refusals.
    env["GPUSCHED_MAX_PENDING_JOBS_PER_USER"] = str(args.queued + 1_000_000)
    subprocess.run(
        [sys.executable, "-m", "app.cli", "migrate"],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    token = (data_dir / "admin.token").read_text().strip()
    if args.queued:
        queue_jobs(db_url, args.queued)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "app.asgi:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(args.workers),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        body = {"command": ["python", "train.py"], "gpus": 1, "labels": {"bench": "1"}}

        async def submit(conn: Connection, i: int, n: int) -> int:
            payload = json.dumps({**body, "name": f"c{i}-{n}"}).encode()
            return await conn.request("POST", "/api/v1/jobs", payload)

        async def listing(conn: Connection, i: int, n: int) -> int:
            return await conn.request("GET", "/api/v1/jobs?limit=50")

        run = functools.partial(
            hammer,
            url,
            token,
            clients=args.clients,
            seconds=args.seconds,
            keep_alive=args.keep_alive,
        )
        results = {
            "POST /api/v1/jobs": asyncio.run(run(make_request=submit)),
            "GET /api/v1/jobs": asyncio.run(run(make_request=listing)),
        }
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        drop_pg_database(db_name)

    print(
        f"\nAPI benchmark: {args.clients} clients, {args.seconds:.0f} s each, "
        f"{args.workers} uvicorn workers, PostgreSQL (durable commits), {os.cpu_count()} cores, "
        f"{'keep-alive connections' if args.keep_alive else 'a connection per request'}"
        f"{f', {args.queued:,} jobs queued before' if args.queued else ''}"
    )
    print(f"{'request':<22}{'ok':>8}{'errors':>8}{'per s':>10}{'p50 ms':>9}{'p99 ms':>9}")
    for name, r in results.items():
        print(
            f"{name:<22}{r['ok']:>8}{r['errors']:>8}{r['per_s']:>10.0f}"
            f"{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}"
        )
        if r["error_statuses"]:
            print(f"{'':<22}errors by HTTP status: {r['error_statuses']}")
    out = ROOT / "bench" / "results" / "api_submit.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
