"""Which Unix account a job runs as on this node.

An agent running as root runs each job as its owner's account (``unix_user`` in run_job:
the user's mapping, their gpusched name by default): that account's uid, gid and groups,
its home, umask 077. Only root can switch accounts, so an agent that is not root runs
every job as its own user (single-user: a laptop's ``gpusched up``), as does a root agent
told to with GPUSCHED_AGENT_RUN_AS_USER.

An account that does not exist here, or has uid 0 without GPUSCHED_AGENT_UID0_ACCOUNTS
naming it, is unusable: the agent refuses the run (the job goes back to the queue, no
retry spent) and reports the account in its heartbeats until it becomes usable, so the
scheduler places the owner's jobs elsewhere and says why they wait.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable
from dataclasses import dataclass


class AccountUnusable(Exception):
    """A job cannot run as this account on this node; ``reason`` says why."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"unix account {name!r}: {reason}")
        self.name = name
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Account:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]  # supplementary: the account's own, never the agent's
    home: str


def _account(entry: pwd.struct_passwd) -> Account:
    groups = tuple(g for g in os.getgrouplist(entry.pw_name, entry.pw_gid) if g != entry.pw_gid)
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir or "/")


def resolve(name: str, *, uid0_allowed: Iterable[str] = ()) -> Account:
    """The account a job of `name`'s runs as; AccountUnusable if it cannot."""
    if not name or "/" in name or "\0" in name:
        raise AccountUnusable(name, "not an account name")
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise AccountUnusable(name, "no such account on this node") from None
    if entry.pw_uid == 0 and name not in set(uid0_allowed):
        raise AccountUnusable(
            name, "it has uid 0, and GPUSCHED_AGENT_UID0_ACCOUNTS does not allow it"
        )
    return _account(entry)


def own_user() -> str:
    """The name of the account this process runs as (its uid, if it has no name)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def parse_names(text: str) -> frozenset[str]:
    """A comma-separated list of account names (a setting)."""
    return frozenset(part.strip() for part in text.split(",") if part.strip())
