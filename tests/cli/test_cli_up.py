"""`gpusched up`'s node names: two stacks on one machine (a demo beside the tests, the real-GPU
check's rehearsal) must not share them, since an agent that starts ends the leftover job
processes of its node's name. Its ports, checked before anything starts, and how much its
processes log (tests/e2e/test_up_first_start.py: the console of a real start)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import app as cli_app
from app.cli.client import CliError
from app.cli.up import LogLevel, _agent_plan, _children_log_level, check_ports_free
from app.config import Settings
from app.cycle.settings import SchedulerSettings
from app.logs import celery_options
from tests.support.servers import free_port


def test_simulated_nodes_are_sim_1_and_so_on_by_default() -> None:
    assert _agent_plan("sim:2x4:H100-80GB") == [
        ("sim-1", "sim:4:H100-80GB"),
        ("sim-2", "sim:4:H100-80GB"),
    ]


def test_simulated_nodes_take_the_name_given() -> None:
    assert _agent_plan("sim:2x1:A100-40GB", "lab") == [
        ("lab-1", "sim:1:A100-40GB"),
        ("lab-2", "sim:1:A100-40GB"),
    ]


# A quiet first start (issue 36 point 3): ports checked before anything starts, the
# children's log level.


@pytest.fixture
def taken() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


@pytest.mark.parametrize(
    ("where", "what", "setting"),
    [
        ("api", "the API and dashboard", "--port or GPUSCHED_PORT"),
        ("metrics", "the scheduler's metrics", "GPUSCHED_SCHEDULER_METRICS_PORT"),
        ("reports", "the reports worker's metrics", "GPUSCHED_SCHEDULER_REPORTS_METRICS_PORT"),
    ],
)
def test_a_taken_port_is_an_error_naming_the_port_and_its_setting(
    taken: int, tmp_path: Path, where: str, what: str, setting: str
) -> None:
    free = [free_port() for _ in range(3)]
    ports = dict(zip(("api", "metrics", "reports"), free, strict=True)) | {where: taken}
    settings = Settings(data_dir=tmp_path, port=ports["api"])
    scheduler = SchedulerSettings(
        metrics_port=ports["metrics"], reports_metrics_port=ports["reports"]
    )
    with pytest.raises(CliError) as info:
        check_ports_free(settings, scheduler)
    assert info.value.exit_code == 2
    assert info.value.message.startswith(
        f"port {taken} on 127.0.0.1 ({what}) cannot be used: it is already in use; stop what "
        f"uses it or set {setting}"
    )


def test_free_ports_and_metrics_turned_off_pass(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, port=free_port())
    check_ports_free(settings, SchedulerSettings(metrics_port=0, reports_metrics_port=0))


def test_two_servers_on_one_port_is_an_error(tmp_path: Path) -> None:
    port = free_port()
    settings = Settings(data_dir=tmp_path, port=port)
    with pytest.raises(CliError) as info:
        check_ports_free(settings, SchedulerSettings(metrics_port=port, reports_metrics_port=0))
    assert info.value.message == (
        f"port {port} is wanted by both the API and dashboard and the scheduler's metrics: set "
        "GPUSCHED_SCHEDULER_METRICS_PORT (0: no metrics server) to another port"
    )


def test_up_checks_its_ports_before_it_starts_anything(taken: int, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    env = {
        "GPUSCHED_DATA_DIR": str(data_dir),
        "GPUSCHED_DATABASE_URL": None,
        "GPUSCHED_REDIS_URL": None,
        "GPUSCHED_PORT": str(free_port()),
        "GPUSCHED_SCHEDULER_METRICS_PORT": str(taken),
        "GPUSCHED_SCHEDULER_REPORTS_METRICS_PORT": str(free_port()),
    }
    result = CliRunner().invoke(cli_app, ["up", "--gpus", "sim:1x1:H100-80GB"], env=env)
    assert result.exit_code == 2, result.output
    assert f"port {taken} on 127.0.0.1 (the scheduler's metrics) cannot be used" in result.output
    assert "GPUSCHED_SCHEDULER_METRICS_PORT" in result.output
    # Nothing was started or made: no database, no Redis, no data dir.
    assert not data_dir.exists()
    assert "private Redis" not in result.output


@pytest.mark.parametrize(
    ("asked", "verbose", "env", "level"),
    [
        (None, False, None, "warning"),
        (None, True, None, "info"),
        (LogLevel.debug, True, None, "debug"),
        (None, False, "info", "info"),
        (LogLevel.error, False, "info", "error"),
    ],
)
def test_up_children_log_warnings_only_unless_asked(
    monkeypatch: pytest.MonkeyPatch,
    asked: LogLevel | None,
    verbose: bool,
    env: str | None,
    level: str,
) -> None:
    if env is None:
        monkeypatch.delenv("GPUSCHED_LOG_LEVEL", raising=False)
    else:
        monkeypatch.setenv("GPUSCHED_LOG_LEVEL", env)
    assert _children_log_level(asked, verbose=verbose) == level


def test_quiet_celery_workers_print_no_banner(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSCHED_LOG_LEVEL", "warning")
    assert celery_options() == ["--quiet", "worker"]
    monkeypatch.setenv("GPUSCHED_LOG_LEVEL", "info")
    assert celery_options() == ["worker"]
