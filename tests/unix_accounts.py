"""Real Unix accounts for the tests of jobs running as their owners (useradd; root only).

Made once per test session with names of the session's own (gpusched-t-alice-<hex>), so
runs at once on one host never share them, and removed (with their homes) at its end.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class UnixAccount:
    name: str
    uid: int
    gid: int
    home: str


def _accounts() -> Iterator[dict[str, UnixAccount]]:
    if os.geteuid() != 0:
        pytest.skip("real test accounts need root (useradd): jobs run as their owners only there")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("no useradd/userdel on this host to make test accounts with")
    suffix = uuid.uuid4().hex[:6]
    made: dict[str, UnixAccount] = {}
    try:
        for who in ("alice", "bob", "carol"):
            name = f"gpusched-t-{who}-{suffix}"
            subprocess.run(
                ["useradd", "--create-home", "--shell", "/bin/sh", name],
                check=True,
                capture_output=True,
            )
            entry = pwd.getpwnam(name)
            made[who] = UnixAccount(name, entry.pw_uid, entry.pw_gid, entry.pw_dir)
        yield made
    finally:
        for account in made.values():
            subprocess.run(["userdel", "--remove", account.name], capture_output=True)


unix_accounts = pytest.fixture(scope="session")(_accounts)


def delete_account(name: str) -> None:
    subprocess.run(["userdel", "--remove", name], capture_output=True, check=True)


def make_account(name: str) -> UnixAccount:
    subprocess.run(
        ["useradd", "--create-home", "--shell", "/bin/sh", name], check=True, capture_output=True
    )
    entry = pwd.getpwnam(name)
    return UnixAccount(name, entry.pw_uid, entry.pw_gid, entry.pw_dir)
