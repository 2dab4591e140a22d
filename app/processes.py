"""Child processes that do not outlive the process that started them (Linux)."""

from __future__ import annotations

import ctypes
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Resolved now: a preexec_fn runs between fork and exec, where importing is not safe.
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def die_with_parent() -> None:
    """Have this process get SIGTERM when its parent dies (a `preexec_fn`, or called in a
    forked child).

    `gpusched up`'s children run in sessions of their own (so that Ctrl-C reaches only
    `up`, which stops them in order), and Celery's embedded beat runs in a child of the
    scheduler; a parent killed by SIGKILL or the OOM killer would leave them running,
    still taking jobs or firing cycles. SIGTERM lets each stop as on Ctrl-C (an agent
    gives its jobs their grace period). Linux only; elsewhere a no-op.
    """
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


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
