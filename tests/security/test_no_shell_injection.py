"""Only `command` decides what runs; no other job field ever reaches a shell.

Jobs whose name, env values, labels and workdir carry shell metacharacters are submitted
through the real API, turned into the run_job message by the scheduler's own payload
builder (app.jobs.orders.run_orders), sent through the wire's dump and parse, and run by a real Agent (fake GPU backend and
reporter). A canary file that any of the injections would create must never appear.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import pytest

from app.jobs.models import Job
from app.jobs.orders import run_orders
from app.wire import Finished, RunJob, as_dict, dump, parse
from tests.agent.support import RecordingReporter, installation_of
from tests.security.conftest import Cluster, running_job
from tests.support.wait import WAIT_S
from workers.agent.fence import choose_fence
from workers.agent.gpu_backend import NodeInfo, NodeSample
from workers.agent.runner import JobLaunch, start_job
from workers.agent.service import Agent, AgentSettings


def injections(canary: Path) -> list[str]:
    target = shlex.quote(str(canary))
    return [
        f"$(touch {target})",
        f"`touch {target}`",
        f"; touch {target}",
        f"| touch {target}",
        f"&& touch {target}",
        f"\n touch {target}",
        f"$(python3 -c 'open({str(canary)!r},\"w\")')",
    ]


class NoGpus:
    """A GPU backend with nothing to report: the agent only runs processes here."""

    def node_info(self) -> NodeInfo:
        return NodeInfo("host", "none", ())  # no NVML: jobs see their GPUs by index

    def sample(self) -> NodeSample:  # pragma: no cover
        raise NotImplementedError

    def close(self) -> None:
        pass


def run_through_agent(cluster: Cluster, job_id: int, tmp_path: Path) -> tuple[Finished, str]:
    """Build the run_job message as the scheduler does and run it on a real Agent; return
    the finished report and the attempt's log."""
    with cluster.api.factory() as session:
        [order] = run_orders(session, jobs=[session.get_one(Job, job_id)])
    reporter = RecordingReporter()
    log_dir = tmp_path / "agent-logs"
    agent = Agent(
        # Single-user (every job as root): what is tested here is what reaches a shell.
        settings=AgentSettings(
            name="n1",
            grace_s=1.0,
            sample_interval_s=60,
            installation=installation_of(tmp_path),
            run_as_user="root",
            uid0_accounts="root",
        ),
        backend=NoGpus(),  # type: ignore[arg-type]
        reporter=reporter,
        log_dir=log_dir,
        log_cap_bytes=1_000_000,
        state_dir=tmp_path / "agent-state",
    )
    received = parse(RunJob, dump(order))  # what the agent's queue delivers
    assert agent.run_job(received, sent_at=time.time()) == "started", reporter.reports
    assert reporter.finished.wait(WAIT_S), reporter.reports
    [finished] = reporter.of(Finished)
    log = (log_dir / str(job_id) / "attempt-1.log").read_text()
    return finished, log


@pytest.mark.parametrize("shell_command", [False, True], ids=["argv", "shell-string"])
def test_name_env_labels_and_workdir_never_reach_a_shell(
    cluster: Cluster, tmp_path: Path, shell_command: bool
) -> None:
    canary = tmp_path / "CANARY"
    evil = injections(canary)
    # A workdir that exists, with the injections in its path components (no '/' inside).
    workdir = tmp_path / "w$(touch CANARY)" / "w`touch CANARY`" / "w;touch CANARY|touch CANARY&&"
    workdir.mkdir(parents=True)
    env = {f"INJ{i}": value for i, value in enumerate(evil)}
    # argv: print the environment. Shell string: expand every variable, as users do; the
    # shell must not re-evaluate what an expansion produced.
    command: list[str] | str = ["/usr/bin/env"]
    if shell_command:
        command = "pwd; " + "; ".join(f'echo "$INJ{i}"; echo $INJ{i}' for i in range(len(evil)))
    body = {
        "command": command,
        "name": evil[0][:200],
        "env": env,
        # A label's value takes no control character (a line break), an env value does.
        "labels": {f"l{i}": value[:256] for i, value in enumerate(evil) if "\n" not in value},
        "workdir": str(workdir),
    }
    job_id = running_job(cluster.api, body=body, gpu=1)
    stored = cluster.api.client.get(f"/api/v1/jobs/{job_id}", headers=cluster.headers("alice"))
    assert stored.json()["env"] == env and stored.json()["workdir"] == str(workdir)

    finished, log = run_through_agent(cluster, job_id, tmp_path)

    assert finished.result == "SUCCEEDED", (finished, log)
    assert not canary.exists(), log
    assert not (workdir / "CANARY").exists() and not (tmp_path / "CANARY").exists()
    for value in evil:
        if "\n" not in value:
            assert value in log, (value, log)  # reached the process verbatim, unevaluated
    assert str(workdir) in log if shell_command else f"INJ0={evil[0]}" in log


def test_the_run_job_message_carries_no_name_or_labels(cluster: Cluster) -> None:
    with cluster.api.factory() as session:
        [order] = run_orders(session, jobs=[session.get_one(Job, cluster.ml_running_job)])
    sent = as_dict(order)
    assert "name" not in sent and "labels" not in sent
    assert set(sent) >= {"command", "env", "workdir"}


def test_argv_command_runs_without_a_shell(tmp_path: Path) -> None:
    canary = tmp_path / "CANARY"
    args = [*injections(canary), "*", "~", "$HOME", "a b", "'quoted'"]
    log_path = tmp_path / "logs" / "attempt-1.log"
    process = start_job(
        JobLaunch(
            command=["/usr/bin/printf", "[%s]\\n", *args],
            workdir=tmp_path,
            job_id=1,
            attempt=1,
            log_path=log_path,
            grace_s=1.0,
        ),
        fence=choose_fence(installation_of(tmp_path), "n1"),
    )
    outcome = process.wait(WAIT_S)
    assert outcome is not None and outcome.exit_code == 0
    lines = log_path.read_text()
    assert not canary.exists(), lines
    for arg in args:
        assert f"[{arg}]" in lines, (arg, lines)  # one literal argument each, no expansion


def test_env_values_with_nul_are_refused_not_truncated(tmp_path: Path) -> None:
    from workers.agent.runner import LaunchError

    with pytest.raises(LaunchError):
        start_job(
            JobLaunch(
                command=["/bin/true"],
                workdir=tmp_path,
                job_id=1,
                attempt=1,
                log_path=tmp_path / "l.log",
                env={"A": "x\0; touch CANARY"},
            ),
            fence=choose_fence(installation_of(tmp_path), "n1"),
        )
