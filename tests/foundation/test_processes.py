"""app/processes.py: a subreaper waits for (and, past a deadline, kills) the orphans of its
children, so that `gpusched up` stops last and leaves nothing behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# A subreaper whose child leaves a grandchild behind (the child exits at once, the
# grandchild ignores SIGTERM): once reap_orphans returns, the grandchild is gone. Without
# the subreaper, the orphan would be init's and live on.
SCRIPT = """
import os, subprocess, time
from app.processes import become_subreaper, reap_orphans
become_subreaper()
out = subprocess.run(["sh", "-c", "trap '' TERM; sleep 300 >/dev/null 2>&1 & echo $!"],
                     check=True, capture_output=True, text=True).stdout
orphan = int(out)
assert os.path.exists(f"/proc/{orphan}")
reap_orphans(timeout_s=1)
print("orphan alive" if os.path.exists(f"/proc/{orphan}") else "orphan gone")
"""


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_CHILD_SUBREAPER is Linux's")
def test_reap_orphans_kills_what_outlived_its_parent_and_reaps_it() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == "orphan gone", (done.stdout, done.stderr)
