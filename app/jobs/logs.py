"""Reading an attempt's log.

Paths are built from integers only, never from user text. The job itself can write to its
log directory, though, so a log may have been replaced by a symlink or a FIFO: the file is
opened without following links, must resolve inside the log directory, and must be a
regular file, else it is treated as missing.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import BinaryIO

from app.errors import NotFound

MAX_TAIL_LINES = 10_000


def open_log(path: Path, log_dir: Path) -> BinaryIO | None:
    """The log opened safely for reading, or None when it is absent or not a plain file
    of ours (a link, a FIFO, a device, or anything resolving outside the log directory)."""
    try:
        if not path.resolve().is_relative_to(log_dir.resolve()):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def read_tail(
    path: Path, log_dir: Path, lines: int | None, *, offset: int = 0
) -> tuple[bytes, int]:
    """The log's bytes from byte `offset` on (all of them, or their last `lines` lines)
    and the offset they were read up to, so that the start is that minus their length."""
    handle = open_log(path, log_dir)
    if handle is None:
        return b"", 0
    with handle:
        handle.seek(offset)
        data = handle.read() if lines is None else b"".join(deque(handle, maxlen=lines))
        return data, handle.tell()


def resolve_attempt(*, job_id: int, current_attempt: int, attempt: int | None) -> int:
    chosen = current_attempt if attempt is None else attempt
    if chosen < 1 or chosen > current_attempt:
        raise NotFound(f"job {job_id} has no attempt {chosen} (attempts so far: {current_attempt})")
    return chosen


async def follow(
    path: Path,
    log_dir: Path,
    *,
    start_offset: int,
    still_running: Callable[[], Awaitable[bool]],
    poll_s: float = 0.5,
) -> AsyncIterator[bytes]:
    """Yield what is appended to the log until the attempt ends (then the rest, then stop)."""
    offset = start_offset
    while True:
        running = await still_running()
        handle = open_log(path, log_dir)
        if handle is not None:
            with handle:
                handle.seek(offset)
                chunk = handle.read()
            if chunk:
                offset += len(chunk)
                yield chunk
        if not running:
            return
        await asyncio.sleep(poll_s)
