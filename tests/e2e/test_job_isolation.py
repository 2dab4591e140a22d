"""Jobs of different users on one node, through the whole system (API, scheduler, a root
agent): each runs as its owner's Unix account (real accounts, tests/unix_accounts.py), so
a job of bob's can neither read alice's log, script copy, environment or the admin token,
nor signal her job, which runs on; and nothing a job starts outlives it (the setsid
escape of issue 32), at cancel or at its time limit."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.stack import Stack
from tests.support.wait import poll

pytestmark = pytest.mark.e2e

STACK_AGENTS = {"n1": "sim:4:H100-80GB"}


def _user(stack: Stack, name: str, account: str) -> dict[str, str]:
    body = {"name": name, "projects": ["ml"], "unix_user": account}
    token = stack.api("POST", "/api/v1/users", json=body).json()["token"]
    return {"Authorization": f"Bearer {token}"}


def _submit(stack: Stack, headers: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{stack.url}/api/v1/jobs", json=body, headers=headers, timeout=30)
    assert r.status_code == 201, r.text
    job: dict[str, Any] = r.json()
    return job


def _log_line(stack: Stack, job_id: int, prefix: str) -> str:
    def found() -> str | None:
        for line in stack.logs(job_id).splitlines():
            if line.startswith(prefix):
                return line[len(prefix) :]
        return None

    value: str = poll(f"job {job_id} to print {prefix!r}", found, timeout=30)
    return value


def _alive(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return raw[raw.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def test_bob_cannot_read_or_signal_alices_job(stack: Stack, unix_accounts: dict) -> None:
    alice = _user(stack, "alice", unix_accounts["alice"].name)
    bob = _user(stack, "bob", unix_accounts["bob"].name)
    script = (
        "#!/bin/sh\n"
        'echo "pid $$"; echo "script $0"\n'
        # She can read her own environment: the secret is there to be stolen.
        "tr '\\0' '\\n' < /proc/$$/environ | grep '^SECRET=' | sed 's/^/own /'\n"
        "sleep 120 & wait\n"
    )
    hers = _submit(stack, alice, {"command": ["train.sh"], "script": script, "gpus": 1,
                                  "env": {"SECRET": "alice-s3cret"}})  # fmt: skip
    stack.wait_status(hers["id"], "RUNNING", timeout=30)
    pid = int(_log_line(stack, hers["id"], "pid "))
    script_copy = Path(_log_line(stack, hers["id"], "script "))
    assert _log_line(stack, hers["id"], "own ") == "SECRET=alice-s3cret"
    log = stack.data_dir / "logs" / str(hers["id"]) / "attempt-1.log"
    account = unix_accounts["alice"]
    # Her process, her log, her script copy: all hers, and hers alone.
    assert Path(f"/proc/{pid}").stat().st_uid == account.uid
    assert (log.stat().st_uid, log.stat().st_mode & 0o777) == (account.uid, 0o600)
    assert (script_copy.stat().st_uid, script_copy.stat().st_mode & 0o777) == (account.uid, 0o700)
    token = stack.data_dir / "admin.token"
    assert token.stat().st_mode & 0o777 == 0o600

    attack = (
        'try() { if "$@" > /dev/null 2>&1; then echo "ALLOWED $*"; else echo "denied $*"; fi; }; '
        f"try cat /proc/{pid}/environ; try cat {log}; try cat {script_copy}; try cat {token}; "
        f"try kill -TERM {pid}; try kill -KILL {pid}; echo done"
    )
    theirs = _submit(stack, bob, {"command": attack, "gpus": 1})
    done = stack.wait_status(theirs["id"], "SUCCEEDED", "FAILED", timeout=30)
    assert done["status"] == "SUCCEEDED"
    output = stack.logs(theirs["id"])
    assert "done" in output, output
    assert "ALLOWED" not in output, output
    assert output.count("denied") == 6, output
    # Her job runs on, untouched.
    assert stack.job(hers["id"])["status"] == "RUNNING" and _alive(pid)
    stack.cancel(hers["id"])
    assert stack.wait_status(hers["id"], "CANCELLED", timeout=30)["status"] == "CANCELLED"


ESCAPE = 'setsid env -i sh -c "exec sleep 313" & echo "escaped $!"; sleep 120'


def test_the_setsid_escape_dies_at_cancel(stack: Stack, unix_accounts: dict) -> None:
    alice = _user(stack, "alice2", unix_accounts["alice"].name)
    job = _submit(stack, alice, {"command": ESCAPE, "gpus": 1})
    stack.wait_status(job["id"], "RUNNING", timeout=30)
    escaped = int(_log_line(stack, job["id"], "escaped "))
    poll("the escape to run", lambda: _alive(escaped) and os.getsid(escaped) == escaped, timeout=30)
    stack.cancel(job["id"])
    stack.wait_status(job["id"], "CANCELLED", timeout=30)
    poll("the escape gone", lambda: not _alive(escaped))  # reaped, not only signalled


def test_the_setsid_escape_dies_at_the_time_limit(stack: Stack, unix_accounts: dict) -> None:
    alice = _user(stack, "alice3", unix_accounts["alice"].name)
    # A limit the escape is made well within, even on a loaded machine.
    job = _submit(stack, alice, {"command": ESCAPE, "gpus": 1, "max_runtime_s": 6})
    escaped = int(_log_line(stack, job["id"], "escaped "))
    done = stack.wait_status(job["id"], "TIMED_OUT", "SUCCEEDED", "FAILED", timeout=60)
    assert done["status"] == "TIMED_OUT"
    poll("the escape gone", lambda: not _alive(escaped))  # reaped, not only signalled
