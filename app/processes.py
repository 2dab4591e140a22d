"""Child processes that do not outlive the process that started them (Linux)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PR_SET_CHILD_SUBREAPER = 36
# Resolved now: a preexec_fn runs between fork and exec, where importing is not safe.
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def die_with_parent(parent_pid: int) -> None:
    """Have this process get SIGTERM when its parent `parent_pid` dies (a `preexec_fn`,
    or called in a forked child; the pid is the parent's, taken before the fork).

    `gpusched up`'s children run in sessions of their own (so that Ctrl-C reaches only
    `up`, which stops them in order), and Celery's embedded beat runs in a child of the
    scheduler; a parent killed by SIGKILL or the OOM killer would leave them running,
    still taking jobs or firing cycles. SIGTERM lets each stop as on Ctrl-C (an agent
    gives its jobs their grace period). Linux only; elsewhere a no-op.
    """
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        # A parent that died between the fork and the line above sends nothing: this
        # process was already reparented (a loaded machine widens that window).
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGTERM)


def dies_with_this_process() -> Callable[[], None]:
    """A `preexec_fn` for subprocess.Popen: the child gets SIGTERM when this process dies."""
    return partial(die_with_parent, os.getpid())


class CrashBudget:
    """How often `gpusched up` restarts a process before it gives up on the stack, as
    systemd's StartLimitBurst within StartLimitIntervalSec: at most `burst` restarts of one
    process within `interval_s`. Exits longer ago are forgotten, so a scheduler that
    crashed six times in a week (a Redis restart, a database failover) lives on, and one
    that crashes in a loop stops the stack instead of spinning."""

    def __init__(self, *, burst: int, interval_s: float) -> None:
        self.burst = burst
        self.interval_s = interval_s
        self._exits: dict[str, list[float]] = {}

    def exited(self, name: str, *, now: float) -> bool:
        """Count an exit of `name`; whether it may be restarted."""
        recent = [t for t in self._exits.get(name, []) if now - t < self.interval_s]
        recent.append(now)
        self._exits[name] = recent
        return len(recent) <= self.burst

    def exits(self, name: str) -> int:
        """How many exits of `name` the last `exited` counted within the interval."""
        return len(self._exits.get(name, []))


def become_subreaper() -> None:
    """Orphaned descendants (a grandchild whose parent was killed) become this process's
    children instead of init's, so that it can wait for them: see reap_orphans. Linux
    only; elsewhere a no-op."""
    if _prctl is not None:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text()
            # Fields after the command name (which may hold spaces): state, ppid, ...
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def reap_exited_orphans(known: set[int]) -> None:
    """Reap the orphans reparented to this subreaper that have exited (their zombies),
    leaving alone the children in `known`, which their own Popen objects wait for."""
    for child in _children(os.getpid()):
        if child not in known:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(child, os.WNOHANG)


def reap_orphans(*, timeout_s: float) -> None:
    """Wait until this subreaper has no child left: those it started and has waited for
    are gone; orphans reparented to it (Celery's beat after its worker was killed, which
    gets SIGTERM from die_with_parent) get `timeout_s` to exit, then SIGKILL. What a
    stopping `gpusched up` prints last is then its last line, and nothing outlives it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # no child left
        if pid:
            continue
        if time.monotonic() >= deadline:
            for child in _children(os.getpid()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
        time.sleep(0.05)
