"""Users, projects membership and API tokens."""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from app.audit.service import changes, record
from app.auth.models import ApiToken, User
from app.db import utcnow
from app.errors import FieldError
from app.notifications.hosts import check_url
from app.projects.models import Project, ProjectMember

TOKEN_PREFIX = "gps_"
# A Unix account name as useradd takes it (and no longer than the column).
UNIX_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling, and which projects they may see."""

    user_id: int
    name: str
    is_admin: bool
    projects: frozenset[str]
    project_ids: frozenset[int]
    # name -> id of the user's projects: submissions resolve their project without a query.
    project_id_by_name: Mapping[str, int] = field(default_factory=dict)
    # id -> the longest time limit of each of them that has one (Project.max_runtime_s).
    project_max_runtime_s: Mapping[int, int] = field(default_factory=dict)
    notify_url: str | None = None  # their default for jobs' notifications (User.notify_url)
    # Pending limits (app/jobs/pending_limits.py), so that a submission reads none: the
    # user's own (None: the cluster's default), and id -> each of their projects' that has one.
    max_pending_jobs: int | None = None
    project_max_pending: Mapping[int, int] = field(default_factory=dict)

    def can_see_project(self, project_id: int) -> bool:
        return self.is_admin or project_id in self.project_ids


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def get_or_create_project(*, session: Session, name: str) -> Project:
    project = session.scalar(select(Project).where(Project.name == name))
    if project is None:
        project = Project(name=name, gpu_quota=0, weight=1.0)
        session.add(project)
        session.flush()
    return project


def issue_token(*, session: Session, user: User, ttl_days: int, label: str, actor: str) -> str:
    token = _add_token(session=session, user=user, ttl_days=ttl_days, label=label)
    record(
        session=session, actor=actor, action="token.create", target=user.name, info={"label": label}
    )
    return token


def _add_token(*, session: Session, user: User, ttl_days: int, label: str) -> str:
    token = new_token()
    expires = utcnow() + timedelta(days=ttl_days) if ttl_days else None
    session.add(
        ApiToken(
            user_id=user.id,
            token_hash=hash_token(token),
            prefix=token[:10],
            label=label,
            expires_at=expires,
        )
    )
    session.flush()
    return token


class UserExists(ValueError):
    pass


def check_unix_user(value: str) -> str:
    """A Unix account name, or FieldError("unix_user") saying what one is."""
    if not UNIX_USER.match(value):
        raise FieldError(
            "unix_user",
            f"{value!r} is not a Unix account name: 1 to 64 letters, digits, '_', '.' or '-',"
            " not starting with '.' or '-'",
        )
    return value


def create_user(
    *,
    session: Session,
    name: str,
    projects: list[str],
    is_admin: bool,
    ttl_days: int,
    actor: str,
    unix_user: str | None = None,
) -> tuple[User, str]:
    """Create a user in the given projects (created when missing) and return its first
    token. Its jobs run as `unix_user` on the nodes (default: its name)."""
    if unix_user is not None:
        check_unix_user(unix_user)
    if session.scalar(select(User.id).where(User.name == name)) is not None:
        raise UserExists(f"user {name!r} already exists")
    user = User(name=name, is_admin=is_admin, unix_user=unix_user or name)
    session.add(user)
    session.flush()
    for project_name in projects:
        project = get_or_create_project(session=session, name=project_name)
        session.add(ProjectMember(user_id=user.id, project_id=project.id))
    token = _add_token(session=session, user=user, ttl_days=ttl_days, label="initial")
    record(
        session=session,
        actor=actor,
        action="user.create",
        target=name,
        info={"projects": projects, "admin": is_admin, "unix_user": user.unix_user},
    )
    return user, token


def user_projects(*, session: Session, user_id: int) -> list[str]:
    return list(
        session.scalars(
            select(Project.name)
            .join(ProjectMember, ProjectMember.project_id == Project.id)
            .where(ProjectMember.user_id == user_id)
            .order_by(Project.name)
        )
    )


def change_membership(
    *, session: Session, user_name: str, projects: list[str], member: bool, actor: str
) -> list[str]:
    """Add a user to projects (created when missing) or remove it from them, as Slurm's
    `sacctmgr add/remove user ... account=`; returns the user's projects after the change.

    A user keeps at least one project: without one it could not submit anything."""
    user = find_user(session=session, name=user_name)
    before = user_projects(session=session, user_id=user.id)
    current = set(before)
    if member:
        for name in projects:
            if name not in current:
                project = get_or_create_project(session=session, name=name)
                session.add(ProjectMember(user_id=user.id, project_id=project.id))
    else:
        missing = [name for name in projects if name not in current]
        if missing:
            raise LookupError(f"{user_name!r} is not in project(s) {', '.join(missing)}")
        if current <= set(projects):
            raise ValueError(
                f"{user_name!r} would be left without a project; add it to another one first"
            )
        session.execute(
            delete(ProjectMember).where(
                ProjectMember.user_id == user.id,
                ProjectMember.project_id.in_(select(Project.id).where(Project.name.in_(projects))),
            )
        )
    session.flush()
    TOKEN_CACHE.clear()  # this process at once; other API processes within the cache time
    after = user_projects(session=session, user_id=user.id)
    if after != before:
        action = "user.add_to_project" if member else "user.remove_from_project"
        info = changes({"projects": before}, {"projects": after})
        record(session=session, actor=actor, action=action, target=user_name, info=info)
    return after


@dataclass(frozen=True, slots=True)
class UserSummary:
    name: str
    is_admin: bool
    projects: list[str]
    active_tokens: int  # neither revoked nor expired
    unix_user: str
    max_pending_jobs: int | None  # None: the cluster's default
    max_running_jobs: int | None  # None: no limit
    max_gpus: int | None  # None: no limit


def list_users(*, session: Session, now: datetime) -> list[UserSummary]:
    """Every user with its role, projects and how many of its tokens still work."""
    return [
        _summary(session, user, now=now)
        for user in session.scalars(select(User).order_by(User.name))
    ]


def find_user(*, session: Session, name: str) -> User:
    user = session.scalar(select(User).where(User.name == name))
    if user is None:
        raise LookupError(f"no user named {name!r}")
    return user


def user_summary(*, session: Session, name: str, now: datetime) -> UserSummary:
    return _summary(session, find_user(session=session, name=name), now=now)


def _summary(session: Session, user: User, *, now: datetime) -> UserSummary:
    active = sum(
        1
        for t in user.tokens
        if t.revoked_at is None and (t.expires_at is None or t.expires_at > now)
    )
    projects = user_projects(session=session, user_id=user.id)
    return UserSummary(
        name=user.name,
        is_admin=user.is_admin,
        projects=projects,
        active_tokens=active,
        unix_user=user.unix_user,
        max_pending_jobs=user.max_pending_jobs,
        max_running_jobs=user.max_running_jobs,
        max_gpus=user.max_gpus,
    )


def set_notify_url(
    *, session: Session, user_id: int, url: str | None, allowed_hosts: frozenset[str]
) -> None:
    """A user's default notification URL, held to the hosts a job's own URL may name (a
    422 on the field); this process sees it at once, other API processes within the
    token cache time."""
    if url is not None and (refused := check_url(url, allowed_hosts)) is not None:
        raise FieldError("notify_url", refused)
    user = session.get_one(User, user_id)
    user.notify_url = url
    TOKEN_CACHE.clear()


def set_admin(*, session: Session, user_name: str, is_admin: bool, actor: str) -> bool:
    """Make a user an admin or a plain user, as `sacctmgr modify user ... set
    adminlevel=`; returns whether that changed anything. The last admin stays one: without
    an admin, nobody could change quotas, drain nodes or manage users over the API."""
    user = find_user(session=session, name=user_name)
    if user.is_admin == is_admin:
        return False
    if not is_admin:
        others = session.scalar(
            select(func.count()).select_from(User).where(User.is_admin, User.id != user.id)
        )
        if not others:
            raise ValueError(f"{user_name!r} is the last admin; make another user an admin first")
    user.is_admin = is_admin
    TOKEN_CACHE.clear()  # this process at once; other API processes within the cache time
    record(
        session=session,
        actor=actor,
        action="user.role",
        target=user_name,
        info=changes({"admin": not is_admin}, {"admin": is_admin}),
    )
    return True


def _set_user_field(
    *, session: Session, user_name: str, field: str, value: object, action: str, actor: str
) -> bool:
    """Set one of a user's fields, audited; returns whether that changed anything."""
    user = find_user(session=session, name=user_name)
    before = getattr(user, field)
    if before == value:
        return False
    record(
        session=session,
        actor=actor,
        action=action,
        target=user_name,
        info=changes({field: before}, {field: value}),
    )
    setattr(user, field, value)
    # Principals carry the user's limits: this process at once, others within the cache time.
    TOKEN_CACHE.clear()
    return True


def set_unix_user(*, session: Session, user_name: str, unix_user: str, actor: str) -> bool:
    """The Unix account the user's jobs run as from now on (jobs already running keep
    theirs); returns whether that changed anything."""
    check_unix_user(unix_user)
    return _set_user_field(
        session=session, user_name=user_name, field="unix_user", value=unix_user,
        action="user.unix_user", actor=actor,
    )  # fmt: skip


def set_max_pending_jobs(
    *, session: Session, user_name: str, limit: int | None, actor: str
) -> bool:
    """How many jobs the user may have pending from now on (None: the cluster's default);
    jobs already pending stay. Returns whether that changed anything."""
    return _set_user_field(
        session=session, user_name=user_name, field="max_pending_jobs", value=limit,
        action="user.limits", actor=actor,
    )  # fmt: skip


def set_max_running_jobs(
    *, session: Session, user_name: str, limit: int | None, actor: str
) -> bool:
    """How many jobs the user may run at once from now on (None: no limit); more wait,
    jobs already running go on. Returns whether that changed anything."""
    return _set_user_field(
        session=session, user_name=user_name, field="max_running_jobs", value=limit,
        action="user.limits", actor=actor,
    )  # fmt: skip


def set_max_gpus(*, session: Session, user_name: str, limit: int | None, actor: str) -> bool:
    """How many GPUs the user's running jobs may use from now on (None: no limit); more
    wait, jobs already running go on. Returns whether that changed anything."""
    return _set_user_field(
        session=session, user_name=user_name, field="max_gpus", value=limit,
        action="user.limits", actor=actor,
    )  # fmt: skip


def revoke_tokens(*, session: Session, user_name: str, actor: str) -> int:
    user = find_user(session=session, name=user_name)
    now = utcnow()
    count = 0
    for token in user.tokens:
        if token.revoked_at is None:
            token.revoked_at = now
            count += 1
    TOKEN_CACHE.clear()
    record(
        session=session,
        actor=actor,
        action="token.revoke",
        target=user_name,
        info={"tokens": count},
    )
    return count


def load_principal(*, session: Session, token: str, now: datetime) -> Principal | None:
    row = session.execute(
        select(ApiToken, User)
        .join(User, User.id == ApiToken.user_id)
        .where(ApiToken.token_hash == hash_token(token))
    ).first()
    if row is None:
        return None
    api_token, user = row
    if api_token.revoked_at is not None:
        return None
    if api_token.expires_at is not None and api_token.expires_at <= now:
        return None
    return principal_for(session=session, user=user)


def principal_for(*, session: Session, user: User) -> Principal:
    """The user with their project memberships as they are now."""
    memberships = session.execute(
        select(Project.id, Project.name, Project.max_runtime_s, Project.max_pending_jobs)
        .join(ProjectMember, ProjectMember.project_id == Project.id)
        .where(ProjectMember.user_id == user.id)
    ).all()
    return Principal(
        user_id=user.id,
        name=user.name,
        is_admin=user.is_admin,
        projects=frozenset(m.name for m in memberships),
        project_ids=frozenset(m.id for m in memberships),
        project_id_by_name=MappingProxyType({m.name: m.id for m in memberships}),
        project_max_runtime_s=MappingProxyType(
            {m.id: m.max_runtime_s for m in memberships if m.max_runtime_s is not None}
        ),
        notify_url=user.notify_url,
        max_pending_jobs=user.max_pending_jobs,
        project_max_pending=MappingProxyType(
            {m.id: m.max_pending_jobs for m in memberships if m.max_pending_jobs is not None}
        ),
    )


class TokenCache:
    """Verified tokens, trusted for a few seconds so a burst of requests costs one lookup.

    Revocation therefore takes effect within the cache period on other processes
    (immediately in the process that revoked).
    """

    def __init__(self) -> None:
        self._entries: dict[str, tuple[float, Principal]] = {}
        self._lock = threading.Lock()

    def get(self, token: str, ttl_s: float) -> Principal | None:
        if ttl_s <= 0:
            return None
        with self._lock:
            entry = self._entries.get(token)
        if entry is None or time.monotonic() - entry[0] > ttl_s:
            return None
        return entry[1]

    def put(self, token: str, principal: Principal) -> None:
        with self._lock:
            if len(self._entries) > 10_000:
                self._entries.clear()
            self._entries[token] = (time.monotonic(), principal)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


TOKEN_CACHE = TokenCache()


def ensure_bootstrap_admin(
    *, session: Session, ttl_days: int, actor: str, unix_user: str | None = None
) -> str | None:
    """On an empty database create user `admin` (project `default`) and return its token;
    its jobs run as `unix_user` (the account that started the installation)."""
    if session.scalar(select(User.id).limit(1)) is not None:
        return None
    _, token = create_user(
        session=session,
        name="admin",
        projects=["default"],
        is_admin=True,
        ttl_days=ttl_days,
        actor=actor,
        unix_user=unix_user if unix_user and UNIX_USER.match(unix_user) else None,
    )
    return token


class FailedAuthLimiter:
    """Slows down token guessing: once `limit` failed token checks within `window_s` were
    counted under one of a failed check's keys (its client address, and the prefix of the
    token it presented), that check is answered 429 instead of 401 until the window has
    passed. It judges failed checks only: a valid token is never refused, however many
    failures others behind the same address had (a NAT, a proxy). Per API process; tokens
    are 256-bit random, so this is about noise and log spam, not brute force feasibility."""

    def __init__(
        self,
        limit: int = 20,
        window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.window_s = window_s
        self._clock = clock  # a test's own: a window's end must not depend on its speed
        self._failures: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, key: str, now: float) -> list[float]:
        kept = [t for t in self._failures.get(key, []) if now - t < self.window_s]
        if kept:
            self._failures[key] = kept
        else:
            self._failures.pop(key, None)
        return kept

    def retry_after(self, *keys: str) -> float | None:
        """Seconds until a failed check under `keys` is answered 401 again; None: now."""
        now = self._clock()
        waits = []
        with self._lock:
            for key in keys:
                recent = self._recent(key, now)
                if len(recent) >= self.limit:
                    waits.append(self.window_s - (now - recent[-self.limit]))
        return max(waits, default=None)

    def failed(self, *keys: str) -> None:
        now = self._clock()
        with self._lock:
            if len(self._failures) > 100_000:
                self._failures.clear()
            for key in keys:
                recent = self._recent(key, now)
                recent.append(now)
                self._failures[key] = recent


def failure_keys(*, client: str, token: str) -> tuple[str, ...]:
    """What a failed token check is counted under: its client's address, and the prefix
    of the token it presented (as stored, `ApiToken.prefix`): one address guessing, or
    many guessing at one token."""
    address = f"address {client}"
    return (address, f"token {token[:10]}") if token else (address,)
