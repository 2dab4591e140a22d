"""API submission benchmark: accepted submissions/s and latency, then GET /api/v1/jobs.

Starts the API (uvicorn, several workers) against a fresh PostgreSQL database, submits jobs
from concurrent clients for a fixed time, and prints a table. No scheduler or agent runs,
so this measures the API and database path only.

    .venv/bin/python bench/api_submit.py [--clients 32] [--seconds 10] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
PG_URL = os.environ.get("GPUSCHED_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def create_database() -> tuple[str, str]:
    name = f"gpusched_bench_{uuid.uuid4().hex[:8]}"
    with create_engine(PG_URL, isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    return name, make_url(PG_URL).set(database=name).render_as_string(hide_password=False)


def drop_database(name: str) -> None:
    with create_engine(PG_URL, isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def hammer(url: str, token: str, *, clients: int, seconds: float, make_request) -> dict:
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {token}"}, limits=limits, timeout=30
    ) as http:

        async def client(i: int) -> None:
            nonlocal errors
            n = 0
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                response = await make_request(http, i, n)
                if response.status_code in (200, 201):
                    latencies.append(time.perf_counter() - started)
                else:
                    errors += 1
                n += 1

        began = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(clients)))
        elapsed = time.perf_counter() - began
    return {
        "ok": len(latencies),
        "errors": errors,
        "per_s": len(latencies) / elapsed,
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    db_name, db_url = create_database()
    data_dir = Path(tempfile.mkdtemp(prefix="gpusched-bench-"))
    port = free_port()
    env = {**os.environ, "GPUSCHED_DATABASE_URL": db_url, "GPUSCHED_DATA_DIR": str(data_dir)}
    env.pop("GPUSCHED_REDIS_URL", None)  # no scheduler here: nothing to notify
    subprocess.run(
        [sys.executable, "-m", "app.cli", "migrate"],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    token = (data_dir / "admin.token").read_text().strip()
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

        async def submit(http, i, n):
            return await http.post("/api/v1/jobs", json={**body, "name": f"c{i}-{n}"})

        async def listing(http, i, n):
            return await http.get("/api/v1/jobs", params={"limit": 50})

        results = {
            "POST /api/v1/jobs": asyncio.run(
                hammer(url, token, clients=args.clients, seconds=args.seconds, make_request=submit)
            ),
            "GET /api/v1/jobs": asyncio.run(
                hammer(url, token, clients=args.clients, seconds=args.seconds, make_request=listing)
            ),
        }
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        drop_database(db_name)

    print(
        f"\nAPI benchmark: {args.clients} clients, {args.seconds:.0f} s each, "
        f"{args.workers} uvicorn workers, PostgreSQL, {os.cpu_count()} cores"
    )
    print(f"{'request':<22}{'ok':>8}{'errors':>8}{'per s':>10}{'p50 ms':>9}{'p99 ms':>9}")
    for name, r in results.items():
        print(
            f"{name:<22}{r['ok']:>8}{r['errors']:>8}{r['per_s']:>10.0f}"
            f"{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}"
        )
    out = ROOT / "bench" / "results" / "api_submit.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
