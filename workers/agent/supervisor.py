"""The per-attempt supervisor: the parent of a job's first process, and the child subreaper
of everything the job starts.

    python -I -S supervisor.py gpusched-supervisor INSTALLATION NODE JOB ATTEMPT STATUS_FD

Forked for every attempt, whatever fence the node has, by the agent's fork server
(`serve`, below; workers/agent/forkserver.py), which writes these arguments into the
child's command line. Where there is no fork server the agent (workers/agent/runner.py)
runs it with these arguments, imported (`python -I -S -c "...; supervisor.main(sys.argv)"`)
so that its bytecode is cached.
It reads one message from stdin (argv, env, cwd, the account to run as, the cgroups to
join), starts the job's first process, and then:

- as a child subreaper (prctl PR_SET_CHILD_SUBREAPER), it inherits every process of the
  job whose parent dies (a double fork, `setsid ... &`, nohup): they stay its descendants,
  which is how a node without usable cgroups finds and stops them;
- its first process writes itself into the attempt's cgroups before it drops to the
  job's account (a cgroup's procs file is root's to write), so nothing of the job ever
  runs outside them;
- it tells the agent on STATUS_FD, one message each: {"pid": N} once the job's program runs
  (or {"error": "..."} if it could not), {"exit": N} or {"signal": N} when that first
  process ends, and {"cpu_s", "maxrss_kb"} (its reaped descendants' getrusage) last;
- it leaves when the job's first process has ended and the agent has closed its stdin
  (the agent has stopped what was left of the job by then, or died): what is still
  there gets SIGKILL, is reaped, and the supervisor exits.

Its command line names installation, node, job and attempt, so a restarted agent (or the
watchdog) finds the supervisors of its own attempts; only those running as the agent's own
user are believed. Standard library only, no site-packages (-I -S): nothing of the agent's
environment reaches it or the job.

A supervisor starts for every attempt, so its start is part of every job's: where it
starts as a fresh interpreter, it imports only what is built in or small. A message is a
dict in `marshal`'s format (built into the interpreter; the agent runs the supervisor with
its own), after its length in 4 bytes (`frame`, `read_frame`). JSON would import `re` and `enum`, `signal` imports `enum`, and
`contextlib` imports `collections` and `functools`: 17 of the 20 ms its imports took.
"""

from __future__ import annotations

import ctypes
import marshal
import os
import resource
import select
import sys

try:  # the C module under `signal`, without its enums (see above)
    import _signal as signal
except ImportError:  # pragma: no cover - an interpreter without it
    import signal

# os.execvpe imports warnings (os.get_exec_path) to search PATH. The job's first process
# calls it after dropping to the job's account, which may not be allowed to read this
# interpreter's standard library (a Python under /root, mode 0700): imported here, as
# the agent's user, it is found in sys.modules then.
import warnings  # noqa: F401

MARKER = "gpusched-supervisor"
# argv[1] of the fork server (`serve`): as long as MARKER, which its children write there.
FORKSERVER = "gpusched-forkserver"
# The fork server's placeholders for JOB, ATTEMPT and STATUS_FD, which each child
# overwrites with its own, zero-padded (`_name_self`).
PLACEHOLDERS = ("0" * 19, "0" * 10, "0" * 10)
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
_status_fd = -1  # the agent's pipe (argv[6])
_POLL_S = 0.5
_LENGTH_BYTES = 4


def frame(message: dict[str, object]) -> bytes:
    """One message as it travels: its length, then its marshal bytes."""
    data = marshal.dumps(message)
    return len(data).to_bytes(_LENGTH_BYTES, "big") + data


def read_frame(buffer: bytes) -> tuple[dict[str, object] | None, bytes]:
    """The first whole message in `buffer` and what follows it; None while it is not all
    there. A message that is not a dict reads as {}."""
    if len(buffer) < _LENGTH_BYTES:
        return None, buffer
    end = _LENGTH_BYTES + int.from_bytes(buffer[:_LENGTH_BYTES], "big")
    if len(buffer) < end:
        return None, buffer
    try:
        message = marshal.loads(buffer[_LENGTH_BYTES:end])
    except (ValueError, EOFError, TypeError):
        message = {}
    return (message if isinstance(message, dict) else {}), buffer[end:]


def _read_spec(fd: int) -> dict[str, object] | None:
    """The agent's launch message on `fd`; None if it closed first or sent no dict."""
    buffer = b""
    while True:
        message, _ = read_frame(buffer)
        if message is not None:
            return message or None
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        buffer += chunk


def _say(message: dict[str, object]) -> None:
    try:  # noqa: SIM105 - contextlib costs the start (see above)
        os.write(_status_fd, frame(message))
    except OSError:
        pass  # the agent is gone; the job's fate is the watchdog's


def _start_child(spec: dict[str, object]) -> int:
    """Fork the job's first process; its pid, after its program has been exec'd (an error
    exec'ing it is raised here as OSError with the child's message)."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # the job's first process
        os.close(read_end)
        try:
            _become_job(spec)
        except BaseException as exc:
            detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            os.write(
                write_end, f"{getattr(exc, 'gpusched_step', 'cannot start')}: {detail}".encode()
            )
        os._exit(127)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 4096):
        chunks.append(chunk)
    os.close(read_end)
    if chunks:  # the exec failed: reap the child and say why
        os.waitpid(pid, 0)
        raise OSError(b"".join(chunks).decode(errors="replace"))
    return pid


def _step(name: str, exc: BaseException) -> BaseException:
    exc.gpusched_step = name  # type: ignore[attr-defined]
    return exc


def _become_job(spec: dict[str, object]) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the agent's pipe is the supervisor's, not the job's
    os.close(null)
    os.setsid()  # a session of its own: a terminal's Ctrl-C is for the agent, not for jobs
    me = str(os.getpid()).encode()
    for procs in spec.get("cgroups") or []:  # type: ignore[attr-defined]
        try:
            fd = os.open(str(procs), os.O_WRONLY)
            try:
                os.write(fd, me)
            finally:
                os.close(fd)
        except OSError as exc:
            raise _step(f"cannot join cgroup {procs}", exc) from None
    uid, gid, groups = spec.get("uid"), spec.get("gid"), spec.get("groups")
    try:
        if groups is not None:
            os.setgroups([int(g) for g in groups])  # type: ignore[attr-defined]
        if gid is not None:
            os.setresgid(int(gid), int(gid), int(gid))  # type: ignore[call-overload]
        if uid is not None:
            os.setresuid(int(uid), int(uid), int(uid))  # type: ignore[call-overload]
    except OSError as exc:
        raise _step("cannot switch to the job's account", exc) from None
    umask = spec.get("umask")
    if umask is not None:
        os.umask(int(umask))  # type: ignore[call-overload]
    try:
        os.chdir(str(spec["cwd"]))
    except OSError as exc:
        raise _step(f"cannot enter {spec['cwd']!r}", exc) from None
    argv = [str(a) for a in spec["argv"]]  # type: ignore[attr-defined]
    env = {str(k): str(v) for k, v in spec["env"].items()}  # type: ignore[attr-defined]
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        raise _step(f"cannot start {argv[0]!r}", exc) from None


def _reap(main: int) -> int | None:
    """Reap every child that has exited; the main one's wait status if it was among them."""
    status = None
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status
        if pid == 0:
            return status
        if pid == main:
            status = code


def _children() -> list[int]:
    """Live processes whose parent is this one (the job's orphans re-parent here)."""
    me = str(os.getpid()).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                raw = handle.read()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2 :].split()
        if len(fields) > 1 and fields[1] == me and fields[0] not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def _kill_the_rest() -> None:
    """SIGKILL whatever of the job is still here, until nothing is: a process forking
    meanwhile leaves a child, which becomes ours when its parent dies."""
    while True:
        _reap(-1)
        try:
            if os.waitpid(-1, os.WNOHANG)[0]:
                continue  # one more ended meanwhile, now reaped
        except ChildProcessError:
            return  # no child left: most jobs end so, without a scan of /proc
        alive = _children()
        if not alive:
            try:
                os.waitpid(-1, 0)  # a child that died between the scan and now
            except ChildProcessError:
                return
            continue
        for pid in alive:
            try:  # noqa: SIM105 - contextlib costs the start (see above)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        select.select([], [], [], 0.01)


def main(argv: list[str]) -> int:
    if len(argv) != 7 or argv[1] != MARKER or not argv[6].isdigit():
        print("usage: supervisor.py gpusched-supervisor INSTALLATION NODE JOB ATTEMPT STATUS_FD",
              file=sys.stderr)  # fmt: skip
        return 2
    return _supervise(int(argv[6]))


def _supervise(status_fd: int) -> int:
    """Start the job of the launch message on stdin, report on `status_fd`, and stay its
    subreaper until it has ended and the agent has closed stdin; the exit status."""
    global _status_fd
    _status_fd = status_fd
    os.set_inheritable(_status_fd, False)  # the job must not hold (or write to) it
    # The agent stops jobs; signals aimed at the supervisor (a terminal's Ctrl-C, a
    # process group's SIGTERM) must not orphan the job.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    # SIGCHLD wakes the select below; the handler itself does nothing.
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        _say({"error": f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}"})
        return 1
    spec = _read_spec(sys.stdin.fileno())
    if spec is None:
        _say({"error": "bad launch spec: no launch message"})
        return 1
    try:
        main_pid = _start_child(spec)
    except (ValueError, KeyError, TypeError) as exc:
        _say({"error": f"bad launch spec: {exc}"})
        return 1
    except OSError as exc:
        _say({"error": str(exc)})
        return 1
    _say({"pid": main_pid})
    # The log pipe must close when the job's processes are gone, not when we are.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (1, 2):
        os.dup2(null, fd)
    os.close(null)
    stdin = sys.stdin.buffer.fileno()
    main_status: int | None = None
    agent_done = False
    while True:
        if main_status is None:
            main_status = _reap(main_pid)
            if main_status is not None:
                if os.WIFSIGNALED(main_status):
                    _say({"signal": os.WTERMSIG(main_status)})
                else:
                    _say({"exit": os.WEXITSTATUS(main_status)})
        else:
            _reap(-1)
        if main_status is not None and agent_done:
            break
        watched = [wake_r] if agent_done else [wake_r, stdin]
        ready, _, _ = select.select(watched, [], [], _POLL_S)
        if wake_r in ready:
            _empty(wake_r)
        if stdin in ready and not os.read(stdin, 4096):
            agent_done = True  # closed: the agent is done with the attempt, or dead
    _kill_the_rest()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    _say({"cpu_s": usage.ru_utime + usage.ru_stime, "maxrss_kb": usage.ru_maxrss})
    return 0


# -- the fork server ---------------------------------------------------------------------
#
#     python -I -S -c "...; supervisor.serve(sys.argv)" gpusched-forkserver INSTALLATION NODE
#         0000000000000000000 0000000000 0000000000     (stdin: a SOCK_SEQPACKET socket)
#
# One per agent, started once (workers/agent/forkserver.py): a supervisor forked from it
# costs a few ms of CPU less than a fresh interpreter's 10-14 (most of a short job's start
# on the node). Each request is "JOB ATTEMPT" with three descriptors: the child's
# stdin (its launch), stdout/stderr (the job's log) and status pipe. It forks; the child
# becomes that attempt's supervisor, renamed as one (`_name_self`), and the reply is the
# child's pid with a pidfd for it (the agent is not its parent; the fork server reaps it).
# It leaves when the agent closes the socket (or dies); its children run on.


def _own_cmdline() -> bytes:
    with open("/proc/self/cmdline", "rb") as handle:
        return handle.read()


def _write_cmdline(text: bytes) -> None:
    """Write `text` over this process's command line, where the kernel reads it from
    (its argv strings, from arg_start, field 48 of proc(5)): `text` must be as long."""
    with open("/proc/self/stat", "rb") as handle:
        raw = handle.read()
    arg_start = int(raw[raw.rfind(b")") + 2 :].split()[45])
    fd = os.open("/proc/self/mem", os.O_WRONLY)
    try:
        os.pwrite(fd, text, arg_start)
    finally:
        os.close(fd)


def _name_self(job: int, attempt: int, status_fd: int) -> None:
    """Make this process's command line a supervisor's, naming its job and attempt, over
    the fork server's (as long: the placeholders are zero-padded), so that a restarted
    agent and the watchdog find it as they find any supervisor."""
    parts = _own_cmdline().split(b"\0")
    at = parts.index(FORKSERVER.encode())
    parts[at] = MARKER.encode()
    for offset, value in enumerate((job, attempt, status_fd), start=3):
        width = len(parts[at + offset])
        digits = str(value).encode()
        if len(digits) > width:
            raise ValueError(f"{value} does not fit the command line")
        parts[at + offset] = digits.rjust(width, b"0")
    _write_cmdline(b"\0".join(parts))


def _forked(request: bytes, fds: list[int], closing: tuple[int, ...]) -> int:
    """The fork server's child: become the supervisor of the requested attempt."""
    global _status_fd
    launch_fd, log_fd, _status_fd = fds  # from here on, a failure is said to the agent
    signal.set_wakeup_fd(-1)  # the fork server's, closed here
    for fd in closing:
        os.close(fd)
    os.dup2(launch_fd, 0)  # over the fork server's socket
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(launch_fd)
    os.close(log_fd)
    os.setsid()  # a session of its own, as a supervisor the agent starts itself
    try:
        job, attempt = (int(word) for word in request.split())
        _name_self(job, attempt, _status_fd)
    except (OSError, ValueError) as exc:
        _say({"error": f"cannot name the supervisor: {exc}"})
        return 1
    return _supervise(_status_fd)


def _empty(wakeup_fd: int) -> None:
    """Read what signals wrote into a non-blocking wakeup pipe."""
    try:
        while os.read(wakeup_fd, 512):
            pass
    except BlockingIOError:
        pass


def _reap_all() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def serve(argv: list[str]) -> int:
    """The fork server's loop (see above)."""
    import socket  # only the fork server needs it, once: not on a fresh supervisor's path

    if len(argv) != 7 or argv[1] != FORKSERVER or tuple(argv[4:]) != PLACEHOLDERS:
        print("usage: supervisor.py gpusched-forkserver INSTALLATION NODE (placeholders)",
              file=sys.stderr)  # fmt: skip
        return 2
    server = socket.socket(fileno=0)
    try:  # what each child will need, tried on itself: its own command line written back
        _write_cmdline(_own_cmdline())
        os.close(os.pidfd_open(os.getpid()))
    except (OSError, AttributeError, IndexError) as exc:
        server.send(f"error: {exc}".encode())
        return 1
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # as a supervisor: the agent's to stop
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    server.send(b"ready")
    while True:
        ready, _, _ = select.select([0, wake_r], [], [])
        if wake_r in ready:
            _empty(wake_r)
            _reap_all()
        if 0 not in ready:
            continue
        request, fds, _, _ = socket.recv_fds(server, 64, 3)
        if not request:
            return 0  # the agent is gone or done: its supervisors run on
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            server.send(b"error: expected three descriptors")
            continue
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _forked(request, fds, (wake_r, wake_w))
            except BaseException as exc:  # never back into the fork server's loop
                _say({"error": f"supervisor: {exc!r}"})
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)  # its child, not reaped yet: this pid is still it
        try:
            socket.send_fds(server, [str(pid).encode()], [pidfd])
        finally:
            os.close(pidfd)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
