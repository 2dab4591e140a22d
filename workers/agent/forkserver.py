"""Each attempt's supervisor forked from one warm interpreter per node, not started afresh.

A supervisor (workers/agent/supervisor.py) starts for every attempt. Started as a fresh
`python -I -S` it costs 10-14 ms of CPU before the job's program runs, most of what a
short job costs the node, and on a small machine the drain of short jobs is bound by CPU.
The fork server (`supervisor.serve`) is that interpreter started once, with the
supervisor's code loaded: starting `true` through a supervisor forked from it costs about
4 ms of CPU, 18 through a fresh one (`bench/job_start.py`, `--fresh`). Its children
are supervisors like any other: the same code, command line (`supervisor._name_self`),
session and account; only their parent differs, so the agent waits for them and signals
them through a pidfd, never by a pid that could be reused.

The runner falls back to a fresh interpreter where there is no usable fork server (a
kernel without pidfds, a /proc/self/mem that cannot be written) and starts a new one
if it dies (killed by hand, the OOM killer).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from typing import IO, Protocol

from workers.agent import supervisor

logger = logging.getLogger(__name__)

# How long the fork server may take to start (an interpreter on a busy machine) or answer.
_ANSWER_S = 60.0
# How long it may take to leave once its socket is closed.
_LEAVE_S = 5.0
_RUN_FORKSERVER = (
    f"import sys; sys.path.append({os.path.dirname(supervisor.__file__)!r}); "
    "import supervisor; sys.exit(supervisor.serve(sys.argv))"
)


class SupervisorProcess(Protocol):
    """What the runner uses of an attempt's supervisor: `subprocess.Popen`'s subset."""

    pid: int
    returncode: int | None
    stdin: IO[bytes] | None
    stdout: IO[bytes] | None

    def wait(self, timeout: float | None = None) -> int | None: ...

    def kill(self) -> None: ...


def readable(fd: int, timeout_s: float | None) -> bool:
    """Whether `fd` can be read (or has hung up) within `timeout_s` (None: no limit).
    poll, not select: an agent running many attempts holds descriptors numbered past
    select's limit (FD_SETSIZE, 1024), where select raises ValueError."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout_s is None else max(0, math.ceil(timeout_s * 1000))))


class ForkedSupervisor:
    """A supervisor the fork server forked: not this process's child, so it is waited for
    and killed through its pidfd. Its exit status stays the fork server's
    (`returncode` None)."""

    returncode: int | None = None

    def __init__(
        self, pid: int, pidfd: int, stdin: IO[bytes], stdout: IO[bytes], status: int
    ) -> None:
        self.pid, self._pidfd = pid, pidfd
        self.stdin: IO[bytes] | None = stdin
        self.stdout: IO[bytes] | None = stdout
        self.status = status  # the read end of its status pipe, the caller's to close

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until it has exited; subprocess.TimeoutExpired after `timeout`."""
        if self._pidfd < 0:
            return None
        if not readable(self._pidfd, timeout):
            raise subprocess.TimeoutExpired(f"supervisor {self.pid}", timeout or 0.0)
        os.close(self._pidfd)
        self._pidfd = -1
        return None

    def kill(self) -> None:
        if self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def __del__(self) -> None:
        if self._pidfd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)


class _Gone(Exception):
    """The fork server is not there (any more) or did not answer."""


class ForkServer:
    """The fork server of one node's agent, started at its first use. Thread-safe."""

    def __init__(self, installation: str, node: str) -> None:
        self.installation, self.node = installation, node
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self.unusable: str | None = None  # why this host cannot have one, once known

    def spawn(self, job_id: int, attempt: int) -> ForkedSupervisor | None:
        """The supervisor of this attempt; None where there is no usable fork server
        (start one afresh then)."""
        with self._lock:
            for _ in range(2):  # one that died meanwhile is started again, once
                if self.unusable is not None:
                    return None
                try:
                    if self._socket is None and not self._start():
                        return None
                    return self._request(job_id, attempt)
                except _Gone as exc:
                    logger.warning("supervisor fork server for %s: %s", self.node, exc)
                    self._stop()
            return None

    def stop(self) -> None:
        with self._lock:
            self._stop()

    def _start(self) -> bool:
        """Start it; False if this host cannot have one (`unusable` says why)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-S",
                    "-c",
                    _RUN_FORKSERVER,
                    supervisor.FORKSERVER,
                    self.installation,
                    self.node,
                    *supervisor.PLACEHOLDERS,
                ],
                cwd="/",
                env={},  # nothing of the agent's: each job's environment travels in its launch
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a terminal's Ctrl-C is for the agent
                close_fds=True,
            )
        except OSError as exc:
            ours.close()
            raise _Gone(f"cannot start it: {exc.strerror or exc}") from exc
        finally:
            theirs.close()
        self._socket = ours
        ours.settimeout(_ANSWER_S)
        try:
            answer = ours.recv(256)
        except OSError as exc:
            raise _Gone(f"no answer at its start: {exc}") from exc
        if answer != b"ready":
            self.unusable = answer.decode(errors="replace") or "it left at its start"
            logger.warning(
                "supervisors start as fresh interpreters on %s (no fork server: %s)",
                self.node,
                self.unusable,
            )
            self._stop()
            return False
        return True

    def _request(self, job_id: int, attempt: int) -> ForkedSupervisor:
        assert self._socket is not None
        # Pipes of this request's own: a child forked by a fork server that died before
        # it answered must not write into the next try's.
        launch_r, launch_w = os.pipe()
        log_r, log_w = os.pipe()
        status_r, status_w = os.pipe()
        try:
            socket.send_fds(
                self._socket, [f"{job_id} {attempt}".encode()], [launch_r, log_w, status_w]
            )
            answer, pidfds, _, _ = socket.recv_fds(self._socket, 256, 1)
        except OSError as exc:
            for fd in (launch_w, log_r, status_r):
                os.close(fd)
            raise _Gone(f"lost: {exc}") from exc
        finally:  # the child's ends, now its own
            for fd in (launch_r, log_w, status_w):
                os.close(fd)
        if not answer.isdigit() or len(pidfds) != 1:
            for fd in (launch_w, log_r, status_r, *pidfds):
                os.close(fd)
            raise _Gone(answer.decode(errors="replace") or "it left")
        return ForkedSupervisor(
            int(answer), pidfds[0], os.fdopen(launch_w, "wb"), os.fdopen(log_r, "rb"), status_r
        )

    def _stop(self) -> None:
        if self._socket is not None:
            self._socket.close()  # it leaves at this EOF; its supervisors run on
            self._socket = None
        if self._process is not None:
            try:
                self._process.wait(_LEAVE_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None


_servers: dict[tuple[str, str], ForkServer] = {}
_servers_lock = threading.Lock()


def fork_server(installation: str, node: str) -> ForkServer:
    """This process's fork server for the node's supervisors."""
    with _servers_lock:
        server = _servers.get((installation, node))
        if server is None:
            server = _servers[(installation, node)] = ForkServer(installation, node)
        return server


def stop_all() -> None:
    """Stop this process's fork servers (their supervisors run on); the next start of a
    supervisor starts one again."""
    with _servers_lock:
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        server.stop()
