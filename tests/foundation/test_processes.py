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


# A subreaper whose child forks a grandchild and exits before the grandchild calls
# die_with_parent: prctl then has no parent left to watch, so without its own check the
# grandchild (Celery's beat, when the scheduler is killed as it starts) would live on.
LATE_SCRIPT = '''
import os, signal, subprocess, sys, time
from app.processes import become_subreaper
become_subreaper()
CHILD = """
import os, time
parent = os.getpid()
if os.fork():
    os._exit(0)
os.close(1)
while os.getppid() == parent:
    time.sleep(0.01)
from app.processes import die_with_parent
die_with_parent(parent)
time.sleep(120)
"""
child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE)
child.communicate()
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    pid, status = os.waitpid(-1, os.WNOHANG)
    if pid and pid != child.pid:
        print("SIGTERM" if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
              else f"status {status}")
        break
    time.sleep(0.05)
else:
    print("grandchild alive")
'''


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_die_with_parent_after_the_parent_already_died_terminates_at_once() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LATE_SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == "SIGTERM", (done.stdout, done.stderr)
