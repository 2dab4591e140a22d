from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Path, Response
from pydantic import AfterValidator, BaseModel, Field, StrictBool, StringConstraints

from app.api.deps import AdminUser, CurrentUser, SessionDep, SettingsDep
from app.api.problems import problems
from app.auth import service
from app.db import utcnow
from app.errors import Conflict, FieldError, NotFound
from app.paging import PageDep, cut
from app.request_body import RequestBody
from app.text import check_name

router = APIRouter(prefix="/api/v1", tags=["auth"])

# As `gpusched admin` takes them: 1 to 64 characters, surrounding blanks dropped, no
# control characters.
Name = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=64),
    AfterValidator(check_name),
]
UserPath = Annotated[str, Path(min_length=1, max_length=64, description="user name")]
# A project named in a path is created when missing (PUT .../projects/{project}).
ProjectPath = Annotated[
    str,
    Path(min_length=1, max_length=64, description="project name"),
    AfterValidator(check_name),
]


class MeOut(BaseModel):
    name: str
    is_admin: bool
    projects: list[str]
    notify_url: str | None = Field(
        default=None,
        description="where a job of yours that asks for notifications (notify_on) without "
        "a notify_url sends them",
    )


class MeUpdate(RequestBody):
    notify_url: str | None = Field(
        max_length=2048, description="your default notification URL; null: none"
    )


# Checked by the service (service.check_unix_user), which says what an account name is.
UnixUser = Annotated[
    str,
    Field(
        max_length=200,
        description="the Unix account the user's jobs run as on the nodes (their owner's, "
        "as Slurm runs a job as its submitter); an agent not running as root runs every "
        "job as its own user instead",
    ),
]


class UserOut(BaseModel):
    name: str
    is_admin: bool
    projects: list[str]
    active_tokens: int = Field(description="tokens neither revoked nor expired")
    unix_user: str = Field(description="the Unix account the user's jobs run as")
    max_pending_jobs: int | None = Field(
        description="jobs (array tasks each) the user may have pending; null: the cluster's "
        "default (GPUSCHED_MAX_PENDING_JOBS_PER_USER)"
    )
    max_running_jobs: int | None = Field(
        default=None,
        description="jobs the user may run at once (more wait, reason running_limit); "
        "null: no limit of their own",
    )
    max_gpus: int | None = Field(
        default=None,
        description="GPUs the user's running jobs may use (more wait, reason "
        "running_limit); null: no limit of their own",
    )


class UserCreate(BaseModel):
    name: Name = Field(description="the user's name, unique")
    projects: list[Name] = Field(min_length=1, description="created when missing")
    admin: bool = Field(default=False, description="true: the admin role")
    unix_user: UnixUser | None = Field(default=None, description="default: the user's name")


class UserUpdate(RequestBody):
    admin: StrictBool | None = Field(
        default=None, description="true: an admin; false: a plain user"
    )
    unix_user: UnixUser | None = Field(
        default=None, description="the Unix account the user's jobs run as from now on"
    )
    max_pending_jobs: int | None = Field(
        default=None,
        ge=0,
        le=10_000_000,
        description="jobs (array tasks each) the user may have pending from now on; null: "
        "the cluster's default. Jobs already pending stay",
    )
    max_running_jobs: int | None = Field(
        default=None,
        ge=0,
        le=10_000_000,
        description="jobs the user may run at once from now on, as Slurm's MaxJobs; a job "
        "over it waits (pending reason running_limit); null: no limit. Running jobs go on",
    )
    max_gpus: int | None = Field(
        default=None,
        ge=0,
        le=10_000_000,
        description="GPUs the user's running jobs may use from now on, as Slurm's "
        "MaxTRES=gres/gpu (a shared job counts its share); a job over it waits; null: no "
        "limit. Running jobs go on",
    )


class TokenCreate(BaseModel):
    label: Annotated[str, StringConstraints(max_length=64)] = Field(
        default="api", description="what the token is for, shown in its list"
    )


class TokenOut(BaseModel):
    user: UserOut
    token: str = Field(description="the API token, shown only this once")


class RevokedOut(BaseModel):
    user: UserOut
    revoked: int


@router.get("/me", response_model=MeOut)
def me(principal: CurrentUser) -> MeOut:
    """Who the token belongs to (the dashboard shows admin actions only to admins)."""
    return _me_out(principal, notify_url=principal.notify_url)


@router.patch("/me", response_model=MeOut)
def update_me(
    body: MeUpdate, session: SessionDep, settings: SettingsDep, principal: CurrentUser
) -> MeOut:
    """Set your default notification URL, as Slurm mails the submitting user: a job that
    asks for notifications (`notify_on`) without a `notify_url` of its own uses it. Its
    host must be one the server allows (GPUSCHED_NOTIFY_HOSTS)."""
    service.set_notify_url(
        session=session,
        user_id=principal.user_id,
        url=body.notify_url,
        allowed_hosts=settings.notify_host_set,
    )
    session.commit()
    return _me_out(principal, notify_url=body.notify_url)


def _me_out(principal: service.Principal, *, notify_url: str | None) -> MeOut:
    return MeOut(
        name=principal.name,
        is_admin=principal.is_admin,
        projects=sorted(principal.projects),
        notify_url=notify_url,
    )


# Users, their projects and tokens, as `gpusched admin` (which needs the database) and
# Slurm's sacctmgr (which talks to slurmdbd): admins manage them over the API too.


@contextmanager
def _refusals() -> Iterator[None]:
    """The user service's refusals as HTTP answers: no such user or membership (a
    LookupError, which `gpusched admin` prints as is) is a 404, a conflict with what
    exists (a ValueError: the user exists, or would be left without a project) a 409."""
    try:
        yield
    except LookupError as exc:
        raise NotFound(str(exc.args[0])) from None
    except ValueError as exc:
        raise Conflict(str(exc.args[0])) from None


def _user(session: SessionDep, name: str) -> UserOut:
    with _refusals():
        summary = service.user_summary(session=session, name=name, now=utcnow())
    return UserOut(**asdict(summary))


@router.get("/users", response_model=list[UserOut])
def list_users(
    session: SessionDep, admin: AdminUser, page: PageDep, response: Response
) -> list[UserOut]:
    """Every user with role, projects and how many tokens still work, by name, a page at a
    time (X-Total-Count: how many) (admin)."""
    users = [UserOut(**asdict(u)) for u in service.list_users(session=session, now=utcnow())]
    return cut(response, page, users)


@router.post(
    "/users",
    response_model=TokenOut,
    status_code=201,
    responses=problems(409, s409="A user of that name exists"),
)
def create_user(
    body: UserCreate, session: SessionDep, settings: SettingsDep, admin: AdminUser
) -> TokenOut:
    """Create a user in its projects (created when missing) and return its first token,
    shown only this once (admin)."""
    with _refusals():
        _, token = service.create_user(
            session=session,
            name=body.name,
            projects=list(dict.fromkeys(body.projects)),
            is_admin=body.admin,
            ttl_days=settings.token_ttl_days,
            actor=admin.name,
            unix_user=body.unix_user,
        )
    session.commit()
    return TokenOut(user=_user(session, body.name), token=token)


# The running limits PATCH sets, each by its audited setter.
_RUNNING_LIMITS = {
    "max_running_jobs": service.set_max_running_jobs,
    "max_gpus": service.set_max_gpus,
}


@router.patch("/users/{name}", response_model=UserOut, responses=problems(409))
def update_user(name: UserPath, body: UserUpdate, session: SessionDep, admin: AdminUser) -> UserOut:
    """Make a user an admin or a plain user, as `sacctmgr modify user ... set adminlevel=`,
    set the Unix account their jobs run as, how many jobs they may have pending
    (`sacctmgr modify user ... set MaxSubmitJobs=`), run at once (MaxJobs) and how many
    GPUs they may use (MaxTRES=gres/gpu); idempotent. The last admin stays one (409).
    Other API processes see a role change within the token cache time (admin)."""
    sets_limit = "max_pending_jobs" in body.model_fields_set  # null: back to the default
    # null: no limit
    limits = {f: getattr(body, f) for f in _RUNNING_LIMITS if f in body.model_fields_set}
    if body.admin is None and body.unix_user is None and not sets_limit and not limits:
        raise FieldError(
            "admin",
            "give admin, unix_user, max_pending_jobs, max_running_jobs, max_gpus or several",
        )
    with _refusals():
        if body.admin is not None:
            service.set_admin(
                session=session, user_name=name, is_admin=body.admin, actor=admin.name
            )
        if body.unix_user is not None:
            service.set_unix_user(
                session=session, user_name=name, unix_user=body.unix_user, actor=admin.name
            )
        if sets_limit:
            service.set_max_pending_jobs(
                session=session, user_name=name, limit=body.max_pending_jobs, actor=admin.name
            )
        for field, limit in limits.items():
            _RUNNING_LIMITS[field](session=session, user_name=name, limit=limit, actor=admin.name)
    session.commit()
    return _user(session, name)


@router.post("/users/{name}/tokens", response_model=TokenOut, status_code=201)
def create_token(
    name: UserPath,
    session: SessionDep,
    settings: SettingsDep,
    admin: AdminUser,
    body: TokenCreate | None = None,
) -> TokenOut:
    """Issue another token for a user, shown only this once (admin)."""
    with _refusals():
        user = service.find_user(session=session, name=name)
    token = service.issue_token(
        session=session,
        user=user,
        ttl_days=settings.token_ttl_days,
        label=(body or TokenCreate()).label,
        actor=admin.name,
    )
    session.commit()
    return TokenOut(user=_user(session, name), token=token)


@router.delete(
    "/users/{name}/tokens",
    response_model=RevokedOut,
    responses=problems(409, s409="An admin revoking their own tokens would lock themselves out"),
)
def revoke_tokens(name: UserPath, session: SessionDep, admin: AdminUser) -> RevokedOut:
    """Revoke every token of a user; other API processes notice within the token cache
    time (admin). Not your own: that would lock you out (`gpusched admin revoke` can)."""
    if name == admin.name:
        raise Conflict("you would lock yourself out: another admin may revoke your tokens")
    with _refusals():
        count = service.revoke_tokens(session=session, user_name=name, actor=admin.name)
    session.commit()
    return RevokedOut(user=_user(session, name), revoked=count)


@router.put("/users/{name}/projects/{project}", response_model=UserOut, responses=problems(409))
def add_to_project(
    name: UserPath, project: ProjectPath, session: SessionDep, admin: AdminUser
) -> UserOut:
    """Add a user to a project (created when missing), as `sacctmgr add user ...
    account=`; idempotent (admin)."""
    with _refusals():
        service.change_membership(
            session=session, user_name=name, projects=[project], member=True, actor=admin.name
        )
    session.commit()
    return _user(session, name)


@router.delete(
    "/users/{name}/projects/{project}",
    response_model=UserOut,
    responses=problems(409, s409="The user would be left without a project"),
)
def remove_from_project(
    name: UserPath, project: ProjectPath, session: SessionDep, admin: AdminUser
) -> UserOut:
    """Remove a user from a project; its jobs there stay. A user keeps at least one
    project (admin)."""
    with _refusals():
        service.change_membership(
            session=session, user_name=name, projects=[project], member=False, actor=admin.name
        )
    session.commit()
    return _user(session, name)
