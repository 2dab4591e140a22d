"""Run a command while every core is kept busy (`make test-under-load`).

    python -m tests.support.cpu_hog [--per-core N] -- COMMAND ...

Starts N busy-looping processes per core (default 1) at normal priority, runs COMMAND,
stops the hogs however COMMAND ends (they die with this process too), prints the
command's wall time, and exits with its status.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from app.processes import dies_with_this_process

_SPIN = "while True: pass"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cpu_hog")
    parser.add_argument("--per-core", type=int, default=1)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command to run is required")
    hogs = [
        subprocess.Popen([sys.executable, "-c", _SPIN], preexec_fn=dies_with_this_process())
        for _ in range((os.cpu_count() or 1) * args.per_core)
    ]
    started = time.monotonic()
    try:
        status = subprocess.call(command)
    finally:
        for hog in hogs:
            hog.send_signal(signal.SIGKILL)
            hog.wait()
    minutes, seconds = divmod(time.monotonic() - started, 60)
    print(
        f"cpu_hog: {len(hogs)} hogs; command exited {status} after {minutes:.0f} min {seconds:.0f} s"
    )
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
