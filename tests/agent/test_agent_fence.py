"""The fence around each job, on each kind this host offers (cgroup v1 hierarchies, the
hybrid host's empty cgroup v2 hierarchy, the supervisor as child subreaper): every process
a job starts is the job's, whatever session it makes for itself, and dies with it; what it
used is measured; groups are found by installation + node + job + attempt alone.

Real processes and real cgroups (under this process's own); an agent not running as root
has only the subreaper, and the cgroup kinds are skipped there, saying so."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.support import installation_of
from tests.support.wait import WAIT_S, wait_until
from workers.agent.fence import (
    Fence,
    FenceError,
    GpuDevice,
    choose_fence,
    denied_devices,
    device_filter_program,
    host_gpu_devices,
    host_pid_namespace_problem,
)
from workers.agent.runner import (
    SUPERVISOR_SCRIPT,
    JobLaunch,
    RunningProcess,
    start_job,
    stop_groups,
)

KINDS = ("cgroup-v1", "cgroup-v2", "subreaper")


def alive(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return raw[raw.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def make_fence(kind: str, installation: str, node: str = "n1") -> Fence:
    try:
        return choose_fence(installation, node, kind)  # type: ignore[arg-type]
    except FenceError as exc:
        why = "not root" if os.geteuid() != 0 else "this host"
        pytest.skip(f"{kind} unavailable ({why}): {exc}")


def clean(fence: Fence) -> None:
    stop_groups([(group, 0.0) for group in fence.find()])
    for group in fence.find():
        group.remove()


@pytest.fixture(params=KINDS)
def fence(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fence]:
    made = make_fence(request.param, installation_of(tmp_path))
    yield made
    clean(made)


def launch(tmp_path: Path, command: str | list[str], **overrides: object) -> JobLaunch:
    fields: dict[str, object] = {
        "command": command,
        "workdir": tmp_path,
        "job_id": 1,
        "attempt": 1,
        "log_path": tmp_path / "attempt-1.log",
        "grace_s": 0.5,
    }
    fields.update(overrides)
    return JobLaunch(**fields)  # type: ignore[arg-type]


def first_line(path: Path) -> str:
    assert wait_until(lambda: path.exists() and path.read_text().strip()), "no output in time"
    return path.read_text().split()[0]


# -- no process outlives its job -------------------------------------------------------

# The escape of issue 32: a new session, a clean environment (no GPUSCHED_* left to find
# it by), re-parented to init once the shell exits. Then a double fork under nohup.
ESCAPES = (
    'setsid env -i sh -c "exec sleep 313" & echo $! > escaped; '
    "(nohup sleep 314 > /dev/null 2>&1 & echo $! > forked) ; sleep 60"
)


def test_a_setsid_escape_and_a_double_fork_die_at_cancel(tmp_path: Path, fence: Fence) -> None:
    running = start_job(launch(tmp_path, ESCAPES), fence=fence)
    escaped = int(first_line(tmp_path / "escaped"))
    forked = int(first_line(tmp_path / "forked"))
    assert wait_until(lambda: {escaped, forked} <= running.pids())
    # It did leave the job's session (once `setsid` has run in the forked shell).
    assert wait_until(lambda: os.getsid(escaped) != os.getsid(running.pid))
    outcome = running.terminate("cancel", timeout_s=WAIT_S)
    assert outcome is not None and outcome.terminated_reason == "cancel"
    # Gone, not only signalled: out of the fence a moment before the kernel reaps it.
    assert wait_until(lambda: not alive(escaped) and not alive(forked))
    assert fence.find() == []


def test_a_setsid_escape_dies_at_the_time_limit(tmp_path: Path, fence: Fence) -> None:
    spec = launch(tmp_path, 'setsid env -i sh -c "exec sleep 313" & echo $! > escaped; sleep 60')
    running = start_job(spec, fence=fence)
    escaped = int(first_line(tmp_path / "escaped"))
    running.set_time_limit(0.1)  # once it has escaped: a limit already past
    outcome = running.wait(WAIT_S)
    assert outcome is not None and outcome.timed_out
    assert wait_until(lambda: not alive(escaped))


def test_an_escape_left_behind_by_a_job_that_ends_on_its_own_dies_with_it(
    tmp_path: Path, fence: Fence
) -> None:
    spec = launch(tmp_path, 'setsid env -i sh -c "exec sleep 313" & echo $! > escaped')
    outcome = start_job(spec, fence=fence).wait(WAIT_S)
    assert outcome is not None and outcome.exit_code == 0
    escaped = int(first_line(tmp_path / "escaped"))
    assert wait_until(lambda: not alive(escaped))


# -- a job's processes are the job's, whatever session they make (issue 39) -------------

TORCHRUN_LIKE = (
    f'{sys.executable} -c "import subprocess, sys; '
    "workers = [subprocess.Popen(['sleep', '60'], start_new_session=True) for _ in range(2)]; "
    "open('workers', 'w').write(' '.join(str(w.pid) for w in workers)); "
    '[w.wait() for w in workers]"'
)


def test_workers_started_in_new_sessions_are_the_jobs(tmp_path: Path, fence: Fence) -> None:
    running = start_job(launch(tmp_path, TORCHRUN_LIKE), fence=fence)
    assert wait_until(lambda: (tmp_path / "workers").exists())
    workers = {int(pid) for pid in (tmp_path / "workers").read_text().split()}
    for pid in workers:
        assert os.getpgid(pid) != os.getpgid(running.pid)  # what used to make them foreign
    assert wait_until(lambda: workers <= running.pids())
    assert os.getpid() not in running.pids()
    running.terminate("cancel", timeout_s=WAIT_S)
    assert wait_until(lambda: not any(alive(pid) for pid in workers))


# -- what a job used --------------------------------------------------------------------

BURN = (
    f'{sys.executable} -c "import time; b = bytearray(64 * 1024 * 1024); t = time.process_time()\n'
    'while time.process_time() - t < 0.4: pass"'
)


def test_cpu_time_and_peak_memory_of_the_whole_job(tmp_path: Path, fence: Fence) -> None:
    # The work is done by a grandchild in a session of its own: measured all the same.
    outcome = start_job(launch(tmp_path, f"setsid {BURN}; true"), fence=fence).wait(WAIT_S)
    assert outcome is not None and outcome.exit_code == 0
    usage = outcome.usage
    assert usage.cpu_s is not None and 0.35 <= usage.cpu_s < 10
    if usage.memory_peak_mb is None:  # the hybrid host's v2 hierarchy has no memory controller
        assert fence.isolation == "cgroup v2"
    else:
        assert usage.memory_peak_mb >= 64


# -- installations and nodes never meet -------------------------------------------------


def test_groups_are_found_by_installation_and_node_alone(tmp_path: Path, fence: Fence) -> None:
    kind = {"cgroup v1": "cgroup-v1", "cgroup v2": "cgroup-v2", "subreaper only": "subreaper"}
    other_installation = make_fence(kind[fence.isolation], installation_of(tmp_path / "other"))
    other_node = make_fence(kind[fence.isolation], fence.installation, node="n1.x")
    started: list[RunningProcess] = []
    try:
        for which, f in (
            ("mine", fence),
            ("installation", other_installation),
            ("node", other_node),
        ):
            spec = launch(tmp_path, "sleep 60", log_path=tmp_path / f"{which}.log")
            started.append(start_job(spec, fence=f))  # job 1 attempt 1 on a node "n1*" each
        [mine] = fence.find()
        assert mine.pids() == started[0].pids() and started[0].pid in mine.pids()
        assert stop_groups([(mine, 0.1)])
        assert started[0].wait(WAIT_S) is not None
        assert started[1].poll() is None and started[2].poll() is None
        assert [g.key for g in other_installation.find()] == [started[1].group.key]
    finally:
        for running in started:
            running.terminate("cancel", grace_s=0, timeout_s=WAIT_S)
        clean(other_installation)
        clean(other_node)


def test_a_job_copying_a_supervisors_command_line_is_not_believed(
    tmp_path: Path, unix_accounts: dict, fence: Fence
) -> None:
    # The subreaper fence finds supervisors by their command line: only the agent's own
    # user's count, or a job could have another job's processes taken for its own.
    if fence.isolation != "subreaper only":
        pytest.skip("cgroup fences find groups by cgroup, not by command line")
    from workers.agent.accounts import resolve

    fake = [
        "/bin/sh", "-c", "sleep 60; true",
        "gpusched-supervisor", fence.installation, "n1", "9", "1", "3",
    ]  # fmt: skip
    bob = resolve(unix_accounts["bob"].name)
    spec = launch(tmp_path, fake, account=bob, workdir="/")
    running = start_job(spec, fence=fence)
    try:
        assert wait_until(lambda: "gpusched-supervisor" in Path(f"/proc/{running.pid}/cmdline")
                          .read_bytes().decode(errors="replace"))  # fmt: skip
        assert [g.key.job_id for g in fence.find()] == [1]
    finally:
        running.terminate("cancel", grace_s=0, timeout_s=WAIT_S)


# -- GPU device files ---------------------------------------------------------------------


@pytest.fixture
def fake_gpus(tmp_path: Path) -> tuple[GpuDevice, ...]:
    """Device files of three GPUs (NVIDIA's major 195) and nvidiactl: without a driver
    behind them, opening one the cgroup allows says "no such device" (ENXIO), one it denies
    "operation not permitted" (EPERM)."""
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    dev = tmp_path / "dev"
    dev.mkdir()
    for name, minor in (("nvidia0", 0), ("nvidia1", 1), ("nvidia2", 2), ("nvidiactl", 255)):
        os.mknod(dev / name, 0o666 | 0o020000, os.makedev(195, minor))
    return host_gpu_devices(dev)


def test_the_rules_for_a_fake_device_list(fake_gpus: tuple[GpuDevice, ...]) -> None:
    assert [(d.major, d.minor) for d in fake_gpus] == [(195, 0), (195, 1), (195, 2)]
    assert [d.minor for d in denied_devices(fake_gpus, [1])] == [0, 2]
    assert denied_devices(fake_gpus, [0, 1, 2]) == ()
    # cgroup v2: the BPF program has one test per denied device, and allows all else.
    assert len(device_filter_program([(195, 0), (195, 2)])) == 8 * (5 + 4 + 4)
    assert len(device_filter_program([])) == 8 * 2


def test_a_job_opens_only_its_own_gpus(
    tmp_path: Path, fence: Fence, fake_gpus: tuple[GpuDevice, ...]
) -> None:
    if not fence.fences_devices:
        pytest.skip(f"{fence.isolation} has no device fence here")
    dev = tmp_path / "dev"
    probe = "; ".join(
        f"{sys.executable} -c \"import os\ntry: os.open('{dev / name}', os.O_RDWR)\n"
        f"except OSError as e: print('{name}', e.errno)\""
        for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl")
    )
    spec = launch(tmp_path, probe)
    outcome = start_job(spec, fence=fence, denied_devices=denied_devices(fake_gpus, [1])).wait(
        WAIT_S
    )
    assert outcome is not None
    errors = dict(line.split() for line in Path(spec.log_path).read_text().splitlines())

    # The others' are refused by the fence (EPERM); its own and nvidiactl reach the
    # driver, which opens them or, for a GPU this host does not have, says so itself.
    assert errors["nvidia0"] == errors["nvidia2"] == str(errno.EPERM), errors
    assert errors.get("nvidia1") != str(errno.EPERM), errors
    assert errors.get("nvidiactl") != str(errno.EPERM), errors


# -- host PIDs --------------------------------------------------------------------------


def test_an_nvml_agent_in_a_pid_namespace_of_its_own_starts_only_if_nvml_speaks_it() -> None:
    # Simulated GPUs, or the host's namespace: nothing to ask.
    assert host_pid_namespace_problem("sim", in_host=False) is None
    assert host_pid_namespace_problem("nvml", in_host=True, local_pids=lambda: False) is None
    # A namespace of its own: the driver is asked; host PIDs, or no answer, refuse.
    assert host_pid_namespace_problem("nvml", in_host=False, local_pids=lambda: True) is None
    refused = host_pid_namespace_problem("nvml", in_host=False, local_pids=lambda: False)
    assert refused is not None and "host PIDs" in refused and "pid: host" in refused
    unknown = host_pid_namespace_problem("nvml", in_host=False, local_pids=lambda: None)
    assert unknown is not None and "cannot tell" in unknown


def test_a_pid_namespace_of_its_own_is_recognised() -> None:
    if os.geteuid() != 0 or not Path("/usr/bin/unshare").exists():
        pytest.skip("unshare --pid needs root and util-linux")
    code = (
        "from workers.agent.fence import host_pid_namespace_problem as p, in_host_pid_namespace;"
        "print(in_host_pid_namespace(), p('nvml', local_pids=lambda: False) or 'none')"
    )
    result = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("False this agent runs in a PID namespace of its own")
    assert "pid: host" in result.stdout


def test_signal_of_a_finished_group_is_harmless(tmp_path: Path, fence: Fence) -> None:
    running = start_job(launch(tmp_path, "true"), fence=fence)
    assert running.wait(WAIT_S) is not None
    running.group.signal(signal.SIGKILL)  # nothing left; nothing else is hit
    assert running.pids() == set()


def test_own_cgroups_are_found_where_the_host_or_a_container_mounts_them() -> None:
    from workers.agent.fence import own_cgroup_dirs

    # The lent GPU machine: cgroup v2 with the controllers, at /sys/fs/cgroup.
    unified = own_cgroup_dirs(
        "35 24 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
        "0::/process_api/b48b\n",
    )
    assert unified.unified == Path("/sys/fs/cgroup/process_api/b48b") and unified.unified_is_host
    # A container on a v1 host sees its own part of each hierarchy mounted at the top.
    hybrid = own_cgroup_dirs(
        "40 31 0:32 /docker/c1 /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "41 31 0:34 /docker/c1 /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer\n"
        "42 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
        "43 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n",
        "6:freezer:/docker/c1/agent\n4:memory:/docker/c1\n2:cpu,cpuacct:/x\n0::/\n",
    )
    assert hybrid.v1 == {
        "freezer": Path("/sys/fs/cgroup/freezer/agent"),
        "memory": Path("/sys/fs/cgroup/memory"),
        "cpuacct": Path("/sys/fs/cgroup/cpu,cpuacct/x"),
    }
    assert hybrid.unified == Path("/sys/fs/cgroup/unified") and not hybrid.unified_is_host


def test_the_jobs_first_process_imports_nothing_once_it_is_the_jobs_account() -> None:
    # After the drop to the job's account the interpreter's standard library may be out of
    # reach (a Python under /root, mode 0700): "sleep", found on PATH, failed there with
    # "No module named 'warnings'". Imports are made impossible here instead.
    script = (
        "import os, sys\n"
        "supervisor = {'__name__': 'supervisor'}\n"
        f"path = {SUPERVISOR_SCRIPT!r}\n"
        "exec(compile(open(path).read(), path, 'exec'), supervisor)\n"
        "sys.meta_path.clear(); sys.path.clear(); sys.path_importer_cache.clear()\n"
        "pid = supervisor['_start_child']({'argv': ['true'], 'env': {'PATH': os.defpath},"
        " 'cwd': '/'})\n"
        "print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, timeout=WAIT_S
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "0\n", "")
