"""The one way a test waits: for a condition, with a deadline generous enough for a
machine that is busy with other work (CI runs on two loaded cores). A fixed sleep never
decides a result.

`GPUSCHED_TEST_WAIT_SCALE` multiplies every deadline (a slower machine than CI's).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

import httpx

T = TypeVar("T")

# The default deadline: what a loaded two-core machine needs for a stack's round trip
# (submit, a scheduling cycle, the agent's start and report), many times over.
WAIT_S = 60.0


def scaled(timeout: float) -> float:
    return timeout * float(os.environ.get("GPUSCHED_TEST_WAIT_SCALE") or 1)


def poll(
    what: str,
    probe: Callable[[], T | None],
    *,
    timeout: float = WAIT_S,
    interval: float = 0.05,
    on_timeout: Callable[[], str] | None = None,
) -> T:
    """Call `probe` until it returns something other than None/False, or fail after
    `timeout` seconds naming `what` (plus `on_timeout()` for context). Connection errors
    count as "not yet": the process asked may still be starting."""
    limit = scaled(timeout)
    deadline = time.monotonic() + limit
    last_exc: BaseException | None = None
    while True:
        try:
            value = probe()
        except (httpx.HTTPError, OSError) as exc:
            value, last_exc = None, exc
        if value is not None and value is not False:
            return value
        if time.monotonic() >= deadline:
            extra = on_timeout() if on_timeout else ""
            why = f" (last error: {last_exc!r})" if last_exc else ""
            raise TimeoutError(f"timed out after {limit:.1f}s waiting for {what}{why}\n{extra}")
        time.sleep(interval)


def wait_until(predicate: Callable[[], object], timeout: float = WAIT_S) -> bool:
    """For a test that asserts on the result itself: True once `predicate()` is true,
    False if it never was within the deadline."""
    try:
        poll("a condition", lambda: bool(predicate()), timeout=timeout, interval=0.02)
    except TimeoutError:
        return False
    return True
