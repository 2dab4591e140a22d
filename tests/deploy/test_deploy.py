"""Deployment as real GPU nodes need it: systemd units for the API, the scheduler (and its
reports process) and the agent, which `systemd-analyze verify` accepts; the agent as root
on the host; and a compose file that keeps the control plane and a demo agent on
simulated GPUs."""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from app.config import Settings

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "deploy" / "systemd"
INSTALLED_BIN = "/opt/gpusched/bin/"  # where README "Running on a cluster" installs
HERE_BIN = str(Path(sys.executable).parent) + "/"  # this checkout's .venv/bin
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


def _unit(name: str) -> configparser.ConfigParser:
    # systemd's syntax is close enough to INI for these files; repeated keys (two
    # EnvironmentFile= lines) are read with strict=False, the last one winning.
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNITS / name)
    return parser


def _units() -> list[Path]:
    units = sorted(UNITS.glob("*.service"))
    assert [u.name for u in units] == [
        "gpusched-agent.service",
        "gpusched-api.service",
        "gpusched-reports.service",
        "gpusched-scheduler.service",
    ]
    return units


@pytest.mark.skipif(
    SYSTEMD_ANALYZE is None,
    reason="no systemd-analyze (Debian's `systemd` package): the units are not verified here",
)
def test_systemd_accepts_every_unit(tmp_path: Path) -> None:
    # As installed, but with this checkout's programs in place of /opt/gpusched/bin (verify
    # checks that every ExecStart program exists).
    for unit in _units():
        (tmp_path / unit.name).write_text(unit.read_text().replace(INSTALLED_BIN, HERE_BIN))
    assert SYSTEMD_ANALYZE is not None
    checked = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", "--man=no", *sorted(str(p) for p in tmp_path.iterdir())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    # verify exits 0 on mere warnings (an unknown key, a value it ignores): none is allowed.
    assert checked.returncode == 0 and not (checked.stdout + checked.stderr).strip(), (
        checked.stdout + checked.stderr
    )


@pytest.mark.parametrize("unit", [u.name for u in sorted(UNITS.glob("*.service"))])
def test_every_units_command_is_one_gpusched_takes(unit: str) -> None:
    """Each ExecStart (and ExecStartPre) names options the CLI has: asked for --help with
    them, it answers instead of refusing an option."""
    service = _unit(unit)["Service"]
    for key in ("ExecStartPre", "ExecStart"):
        if key not in service:
            continue
        argv = shlex.split(service[key].replace(INSTALLED_BIN, HERE_BIN))
        argv = [
            a.replace("${GPUSCHED_HOST}", "0.0.0.0").replace("${GPUSCHED_PORT}", "8000")
            for a in argv
        ]
        assert Path(argv[0]).exists(), argv[0]
        shown = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0, (unit, key, shown.stdout + shown.stderr)


def test_the_agent_runs_as_root_on_the_host_and_lets_jobs_checkpoint_when_stopped() -> None:
    agent = _unit("gpusched-agent.service")["Service"]
    # Root, to start each job as its owner's account; no sandbox that would hide the
    # users' homes or the GPUs from the jobs.
    assert "User" not in agent and "DynamicUser" not in agent
    assert not {"ProtectHome", "ProtectSystem", "PrivateDevices", "NoNewPrivileges"} & set(agent)
    assert agent["ExecStart"].endswith("gpusched agent --gpus nvml")
    # Stopping it stops its jobs with their grace period (the agent does that): systemd
    # signals the agent alone, and waits longer than the longest grace a job may have.
    assert agent["KillMode"] == "mixed"
    assert int(agent["TimeoutStopSec"]) > Settings().max_grace_s
    assert agent["Delegate"] == "yes"  # jobs' cgroups below the agent's
    assert agent["Restart"] == "always"


@pytest.mark.parametrize(
    "unit", ["gpusched-api.service", "gpusched-scheduler.service", "gpusched-reports.service"]
)
def test_the_control_plane_runs_as_its_own_user(unit: str) -> None:
    service = _unit(unit)["Service"]
    assert service["User"] == "gpusched" and service["Restart"] == "always"
    assert service["EnvironmentFile"] == "/etc/gpusched/gpusched.env"
    assert service["ProtectSystem"] == "strict" and service["ReadWritePaths"] == "/var/lib/gpusched"


def test_one_beat_and_the_reports_beside_it() -> None:
    scheduler = _unit("gpusched-scheduler.service")["Service"]["ExecStart"]
    reports = _unit("gpusched-reports.service")["Service"]["ExecStart"]
    assert scheduler.endswith("gpusched scheduler --only cycle --beat")
    assert reports.endswith("gpusched scheduler --only reports")


def test_compose_keeps_the_control_plane_and_a_simulated_agent() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "migrate", "proxy", "api", "scheduler", "reports", "agent"} == set(
        services
    )
    agent = services["agent"]
    assert agent["command"][:3] == ["gpusched", "agent", "--gpus"]
    assert agent["command"][3].startswith("sim:")  # a demo: no job runs inside the image on a GPU
    # Reports processes as replicas (they share job reports; one drains heartbeats).
    assert services["reports"]["deploy"] == {"replicas": 2}
    for name, service in services.items():
        assert "resources" not in service.get("deploy", {}), f"{name} asks for a device"
        assert service.get("pid") != "host", name


HAPROXY = shutil.which("haproxy")
HAPROXY_CFG = REPO / "deploy" / "haproxy" / "haproxy.cfg"


def test_compose_runs_api_replicas_behind_one_address() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    api, proxy = services["api"], services["proxy"]
    assert api["deploy"]["replicas"] >= 2 and "ports" not in api  # replicas share no port
    assert proxy["ports"] == ["8000:8000"]
    assert "./deploy/haproxy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in proxy["volumes"]
    # The proxy reaches every replica by the service's name, on the port they listen on.
    config = HAPROXY_CFG.read_text()
    assert re.search(
        r"^\s*server-template api- \d+ api:8000 check .*resolvers docker", config, re.M
    )
    assert re.search(r"^\s*option httpchk GET /readyz$", config, re.M)
    assert re.search(r"^\s*option forwardfor$", config, re.M)
    # X-Forwarded-For is believed from the proxy's network alone, and no job can send from
    # it: the agent (whose container runs the demo's jobs) is not on it.
    subnet = compose["networks"]["edge"]["ipam"]["config"][0]["subnet"]
    assert api["environment"]["GPUSCHED_TRUSTED_PROXIES"] == subnet
    default = re.fullmatch(r"\$\{GPUSCHED_EDGE_SUBNET:-(.+)\}", subnet)
    assert default and Settings(trusted_proxies=default[1]).trusted_proxy_list == [default[1]]
    assert proxy["networks"] == ["edge"] and "edge" in api["networks"]
    assert all(
        "edge" not in s.get("networks", [])
        for n, s in services.items()
        if n not in {"api", "proxy"}
    )


@pytest.mark.skipif(
    HAPROXY is None,
    reason="no haproxy (Debian's `haproxy` package): its config is not checked here",
)
def test_haproxy_accepts_the_proxy_config() -> None:
    assert HAPROXY is not None
    checked = subprocess.run(
        [HAPROXY, "-c", "-f", str(HAPROXY_CFG)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
