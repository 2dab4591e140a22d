"""`gpusched up` (the README's first command) as the tests that drive the whole stack
start it: on a private data dir and port, with only their own settings."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from app.processes import dies_with_this_process
from tests.support.servers import free_port

REPO = Path(__file__).resolve().parents[1]


def start_up(
    data_dir: Path,
    *,
    port: int,
    gpus: str,
    env: dict[str, str] | None = None,
    args: Sequence[str] = (),
) -> tuple[subprocess.Popen[bytes], dict[str, str], Path]:
    """The process (its own session: SIGINT it as Ctrl-C), its environment and its log;
    `args`: more of `up`'s options."""
    # A developer's GPUSCHED_* (database, Redis) must not leak in.
    own = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCHED_")}
    own.update(
        GPUSCHED_DATA_DIR=str(data_dir),
        GPUSCHED_PORT=str(port),
        # Not the default 9101/9102: `up` refuses to start on a taken port, and stacks run
        # side by side (one per test worker).
        GPUSCHED_SCHEDULER_METRICS_PORT=str(free_port()),
        GPUSCHED_SCHEDULER_REPORTS_METRICS_PORT=str(free_port()),
        # Where `up` saves the CLI's URL and token: not the developer's ~/.config.
        XDG_CONFIG_HOME=str(data_dir / "xdg-config"),
        PYTHONUNBUFFERED="1",
        **(env or {}),
    )
    log = data_dir / "up.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "up", "--gpus", gpus, *args],
            cwd=REPO,
            env=own,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=dies_with_this_process(),  # stopped as on Ctrl-C if the test run is killed
        )
    return proc, own, log
