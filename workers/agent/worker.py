"""The agent as a Celery worker consuming its node's own queue.

Every order is checked before it is obeyed (app.wire.OrderGate: sealed with this node's
key, addressed to it, recent, never seen before), and every report is sealed with the
key. The key comes from a file only the agent's user can read.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any

from celery import Celery, signals
from prometheus_client import start_http_server

from app.config import Settings
from app.logs import celery_options, log_level_name
from app.wire import (
    AGENT_REPORT,
    REGISTER_AGAIN,
    RUN_JOB,
    SET_TIME_LIMIT,
    STOP_JOB,
    OrderGate,
    Refused,
    RegisterAgain,
    Report,
    RunJob,
    SetTimeLimit,
    StopJob,
    celery_app,
    node_queue,
    note_refused,
    report_queue,
    send_sealed,
    wait_installation,
)
from workers.agent.fence import host_pid_namespace_problem
from workers.agent.gpu_backend import open_backend
from workers.agent.service import Agent, AgentCannotStart, AgentSettings

log = logging.getLogger("gpusched.agent")


class KeyFileError(ValueError):
    """The node key file is missing, unreadable or readable by others."""


def key_file_path(settings: Settings, agent_settings: AgentSettings) -> Path:
    """GPUSCHED_AGENT_KEY_FILE, else `<data dir>/agents/<name>/node.key` (where `gpusched
    up` writes it)."""
    default = settings.data_dir / "agents" / agent_settings.name / "node.key"
    return (agent_settings.key_file or default).resolve()


def read_node_key(path: Path) -> bytes:
    """The node's key (hex) from a file that is the agent user's own and no one else's:
    with the key, anyone could speak for the node."""
    hint = "print it with `gpusched admin node-key NAME` where the database is reachable"
    try:
        info = path.stat()
        text = path.read_text().strip()
    except OSError as exc:
        raise KeyFileError(
            f"cannot read the node key file {path}: {exc.strerror}; {hint}"
        ) from None
    if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise KeyFileError(
            f"the node key file {path} must belong to this user and be private "
            f"(chmod 600); it is mode {stat.S_IMODE(info.st_mode):o}, owner uid {info.st_uid}"
        )
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise KeyFileError(f"{path} does not hold a node key (64 hex digits); {hint}")
    return key


class SealedReporter:
    """Sends the agent's reports, each sealed with the node's key."""

    def __init__(self, celery: Celery, *, key: bytes) -> None:
        self.celery = celery
        self._key = key

    def report(self, message: Report, *, producer: Any = None) -> bool:
        """`producer`: a kombu producer to publish with, e.g. inside its publish batch
        (bench/fleet.py sends many simulated nodes' reports in one)."""
        try:
            send_sealed(
                self.celery,
                AGENT_REPORT,
                message,
                key=self._key,
                queue=report_queue(message.KIND),
                producer=producer,
            )
            return True
        except Exception as exc:
            log.warning("could not send report %s: %s", message.KIND, exc)
            return False


def build_agent(settings: Settings, agent_settings: AgentSettings) -> tuple[Celery, Agent]:
    key = read_node_key(key_file_path(settings, agent_settings))
    celery = celery_app(settings.redis_url, name=f"agent-{agent_settings.name}")
    backend, line = open_backend(
        agent_settings.gpus,
        hostname=agent_settings.name,
        sim_state_file=agent_settings.sim_state_file,
        unhealthy_after=agent_settings.unhealthy_after,
        healthy_after=agent_settings.healthy_after,
    )
    log.info("agent %s: %s", agent_settings.name, line)
    problem = host_pid_namespace_problem(
        backend.node_info().backend, local_pids=getattr(backend, "reports_local_pids", None)
    )
    if problem is not None:
        backend.close()
        raise AgentCannotStart(problem)
    if not agent_settings.installation:
        import redis

        client = redis.Redis.from_url(settings.redis_url, socket_timeout=5)
        installation = wait_installation(client)
        client.close()
        agent_settings = agent_settings.model_copy(update={"installation": installation})
    agent = Agent(
        settings=agent_settings,
        backend=backend,
        reporter=SealedReporter(celery, key=key),
        log_dir=settings.log_dir.resolve(),
        log_cap_bytes=settings.log_cap_bytes,
        state_dir=(settings.data_dir / "agents" / agent_settings.name).resolve(),
    )
    gate = OrderGate(node=agent_settings.name, key=key)

    def obey(fields: dict[str, Any]) -> str:
        """Any order task: what it carries decides what is done, not the task's name."""
        try:
            sealed = gate.open(fields)
        except Refused as refused:
            note_refused(refused, receiver=f"agent {agent_settings.name}")
            return "refused"
        order = sealed.message
        if isinstance(order, RunJob):
            return agent.run_job(order, sent_at=sealed.header.sent_at)
        if isinstance(order, StopJob):
            return agent.stop_job(order)
        if isinstance(order, RegisterAgain):
            return agent.register_again()
        assert isinstance(order, SetTimeLimit)
        return agent.set_time_limit(order)

    log.info(
        "agent %s: installation %s; isolation %s%s; jobs run as %s",
        agent_settings.name,
        agent_settings.installation,
        agent.fence.isolation,
        ", GPU device files fenced" if agent.fence.fences_devices else "",
        "their owners' accounts"
        if agent.jobs_run_as is None
        else f"{agent.jobs_run_as} (single-user)",
    )

    # Not shared: each task closes over this app's state, and a shared task would also
    # be registered in every other Celery app of the process (a test builds several).
    @celery.task(name=RUN_JOB, shared=False)
    def run_job(*_args: Any, **fields: Any) -> str:
        return obey(fields)

    @celery.task(name=STOP_JOB, shared=False)
    def stop_job(*_args: Any, **fields: Any) -> str:
        return obey(fields)

    @celery.task(name=SET_TIME_LIMIT, shared=False)
    def set_time_limit(*_args: Any, **fields: Any) -> str:
        return obey(fields)

    @celery.task(name=REGISTER_AGAIN, shared=False)
    def register_again(*_args: Any, **fields: Any) -> str:
        return obey(fields)

    return celery, agent


def run_agent_worker(settings: Settings, agent_settings: AgentSettings) -> None:
    """Blocks: consume `node.<name>` with a thread pool (run_job returns at once; each
    job is watched by its own thread). The caller configures logging."""
    celery, agent = build_agent(settings, agent_settings)
    if agent_settings.metrics_port:
        try:  # refused orders are counted here (gpusched_refused_messages_total)
            start_http_server(agent_settings.metrics_port, addr=settings.host)
        except OSError as exc:
            log.warning("agent metrics not served on port %d: %s", agent_settings.metrics_port, exc)

    @signals.worker_ready.connect(weak=False)
    def _ready(**_: Any) -> None:
        agent.start()

    @signals.worker_shutting_down.connect(weak=False)
    def _shutdown(**_: Any) -> None:
        agent.stop()

    celery.worker_main(
        [
            *celery_options(),
            "--queues",
            node_queue(agent_settings.name),
            "--pool",
            "threads",
            "--concurrency",
            "4",
            "--hostname",
            f"agent-{agent_settings.name}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel",
            log_level_name().upper(),
        ]
    )
