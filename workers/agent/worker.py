"""The agent as a Celery worker consuming its node's own queue."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, signals

from app.config import Settings
from app.logs import configure_logging
from app.messaging import (
    RUN_JOB,
    SET_TIME_LIMIT,
    STOP_JOB,
    Messenger,
    create_celery,
    node_queue,
    wait_installation,
)
from workers.agent.fence import host_pid_namespace_problem
from workers.agent.gpu_backend import open_backend
from workers.agent.service import Agent, AgentCannotStart, AgentSettings

log = logging.getLogger("gpusched.agent")


def build_agent(settings: Settings, agent_settings: AgentSettings) -> tuple[Celery, Agent]:
    """The agent and its Celery app; AgentCannotStart when this host will not do."""
    import redis

    celery = create_celery(settings.redis_url, name=f"agent-{agent_settings.name}")
    backend, line = open_backend(
        agent_settings.gpus,
        hostname=agent_settings.name,
        sim_state_file=agent_settings.sim_state_file,
    )
    log.info("agent %s: %s", agent_settings.name, line)
    problem = host_pid_namespace_problem(
        backend.node_info().backend, local_pids=getattr(backend, "reports_local_pids", None)
    )
    if problem is not None:
        backend.close()
        raise AgentCannotStart(problem)
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=5)
    if not agent_settings.installation:
        installation = wait_installation(client)
        agent_settings = agent_settings.model_copy(update={"installation": installation})
    messenger = Messenger(celery, client)
    agent = Agent(
        settings=agent_settings,
        backend=backend,
        reporter=messenger,
        log_dir=settings.log_dir.resolve(),
        log_cap_bytes=settings.log_cap_bytes,
        state_dir=(settings.data_dir / "agents" / agent_settings.name).resolve(),
    )
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

    @celery.task(name=RUN_JOB)
    def run_job(payload: dict[str, Any]) -> str:
        return agent.run_job(payload)

    @celery.task(name=STOP_JOB)
    def stop_job(payload: dict[str, Any]) -> str:
        return agent.stop_job(payload)

    @celery.task(name=SET_TIME_LIMIT)
    def set_time_limit(payload: dict[str, Any]) -> str:
        return agent.set_time_limit(payload)

    return celery, agent


def run_agent_worker(settings: Settings, agent_settings: AgentSettings) -> None:
    """Blocks: consume `node.<name>` with a thread pool (run_job returns at once; each
    job is watched by its own thread)."""
    configure_logging()
    celery, agent = build_agent(settings, agent_settings)

    @signals.worker_ready.connect(weak=False)
    def _ready(**_: Any) -> None:
        agent.start()

    @signals.worker_shutting_down.connect(weak=False)
    def _shutdown(**_: Any) -> None:
        agent.stop()

    celery.worker_main(
        [
            "worker",
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
            "INFO",
        ]
    )
