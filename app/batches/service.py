"""Cron batches: fire-time arithmetic, CRUD, and firing them exactly once.

Fire times. Cron expressions are matched against the *naive local wall clock* with croniter
and the matches are converted with :func:`app.windows.calendar.resolve_local`, exactly as
off-peak cron windows are (see ``app/windows/calendar.py``): croniter iterating with a
zone-aware start fires ``30 1 * * *`` twice on a fall-back day. So, in the schedule's zone:

* a fire time in the repeated fall-back hour happens once, at its first occurrence;
* a fire time that does not exist (spring-forward gap) happens at the transition
  (02:30 -> 03:00 in America/New_York), once even if several matches fall in the gap.

Firing. :func:`fire_due` looks at every enabled schedule at ``now`` (beat calls it every
:data:`CHECK_INTERVAL_S`; tests pass any ``now``). For each it takes the latest fire time
``<= now`` that is later than both its ``active_from`` and its latest firing; there is at
most one, so downtime never produces several firings ("catch up once"). With
``catch_up="skip"`` a fire time more than :func:`late_tolerance_s` old is recorded as a
skipped firing instead. The firing row and all its jobs are added in one transaction; the
UNIQUE (schedule_id, fire_at) constraint makes every concurrent or repeated attempt fail
and roll back, so a batch is never submitted twice.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, croniter
from pydantic import ValidationError
from sqlalchemy import delete, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from app.audit.service import changes, record
from app.auth.models import User
from app.auth.service import Principal, principal_for
from app.batches.models import BatchFiring, BatchSchedule
from app.batches.schemas import BatchIn, BatchOut, FiringOut
from app.errors import Conflict, DomainError, FieldError, Forbidden, NotFound
from app.jobs.control import cancel_locked
from app.jobs.limits import RuntimeLimits
from app.jobs.models import Job
from app.jobs.orders import AfterCommit, Changed, stop_orders
from app.jobs.schemas import JobCreate
from app.jobs.states import FINISHED
from app.jobs.submission import check_submission, create_job
from app.paging import Page, count
from app.projects.models import Project
from app.windows.calendar import resolve_local, validate_timezone
from app.windows.service import require_window
from app.wire import StopJob

log = logging.getLogger("gpusched.batches")

#: how often beat runs :func:`fire_due` (seconds)
CHECK_INTERVAL_S = 5.0
#: a guard on croniter steps per lookup (a per-minute cron needs ~200)
_MAX_STEPS = 20_000
# Slack around a wall-clock instant so that a DST offset change never hides a match.
_SLACK = timedelta(hours=3)


# --------------------------------------------------------------------------- fire times


def _utc(at: datetime) -> datetime:
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError("datetime must be timezone-aware")
    return at.astimezone(UTC)


def latest_fire_at_or_before(cron: str, zone: ZoneInfo, at: datetime) -> datetime | None:
    """The latest fire time ``<= at`` (aware, in ``zone``), or ``None``.

    Walks backwards over naive wall times; :func:`resolve_local` never decreases as the
    wall time increases, so the first match not after ``at`` is the latest one.
    """
    at_utc = _utc(at)
    it = croniter(cron, at_utc.astimezone(zone).replace(tzinfo=None) + _SLACK)
    for _ in range(_MAX_STEPS):
        try:
            wall = it.get_prev(datetime)
        except CroniterBadDateError:
            return None
        fire = resolve_local(wall, zone)
        if fire.astimezone(UTC) <= at_utc:
            return fire
    return None


def next_fire_after(cron: str, zone: ZoneInfo, after: datetime) -> datetime | None:
    """The earliest fire time strictly after ``after`` (aware, in ``zone``), or ``None``."""
    after_utc = _utc(after)
    it = croniter(cron, after_utc.astimezone(zone).replace(tzinfo=None) - _SLACK)
    for _ in range(_MAX_STEPS):
        try:
            wall = it.get_next(datetime)
        except CroniterBadDateError:
            return None
        fire = resolve_local(wall, zone)
        if fire.astimezone(UTC) > after_utc:
            return fire
    return None


def fire_times(cron: str, zone: ZoneInfo, *, start: datetime, end: datetime) -> list[datetime]:
    """Every fire time in ``(start, end]``, in order (for previews and tests)."""
    out: list[datetime] = []
    at = start
    while True:
        nxt = next_fire_after(cron, zone, at)
        if nxt is None or nxt.astimezone(UTC) > _utc(end):
            return out
        out.append(nxt)
        at = nxt


def late_tolerance_s(check_interval_s: float = CHECK_INTERVAL_S) -> float:
    """How late a fire time may be and still run under ``catch_up="skip"``."""
    return max(60.0, 2 * check_interval_s)


# --------------------------------------------------------------------------- errors


class TemplateFieldError(FieldError):
    """A template failed a check that needs the database; ``loc`` is the full location
    under the body, e.g. ``("templates", 0, "gpus")``."""

    def __init__(self, index: int, error: FieldError) -> None:
        field = ".".join(error.path)
        super().__init__("templates", f"templates[{index}].{field}: {error.message}")
        self.loc: tuple[str | int, ...] = ("templates", index, *error.path)
        self.detail = error.message


# --------------------------------------------------------------------------- reading


def _zone(row: BatchSchedule) -> ZoneInfo:
    return validate_timezone(row.timezone)


def _out(session: Session, row: BatchSchedule, now: datetime, *, viewer: Principal) -> BatchOut:
    """The batch as `viewer` reads it: its templates' environment values only for its
    owner and admins (as a job's), the variables' names for the others."""
    zone = _zone(row)
    owner = session.scalar(select(User.name).where(User.id == row.user_id)) or "?"
    project = session.scalar(select(Project.name).where(Project.id == row.project_id)) or "?"
    last = session.scalar(
        select(BatchFiring.fire_at)
        .where(BatchFiring.schedule_id == row.id, BatchFiring.skipped.is_(False))
        .where(BatchFiring.error.is_(None), BatchFiring.run_by.is_(None))
        .order_by(BatchFiring.fire_at.desc())
        .limit(1)
    )
    nxt = None
    if row.enabled:
        nxt = next_fire_after(row.cron, zone, max(_utc(now), row.active_from))
    return BatchOut(
        id=row.id,
        name=row.name,
        owner=owner,
        project=project,
        cron=row.cron,
        timezone=row.timezone,
        templates=row.templates
        if viewer.is_admin or row.user_id == viewer.user_id
        else [{**t, "env": dict.fromkeys(t.get("env") or {})} for t in row.templates],
        target=row.target,
        window=row.window,
        enabled=row.enabled,
        catch_up=row.catch_up,
        concurrency=row.concurrency,
        created_at=row.created_at.astimezone(zone),
        updated_at=row.updated_at.astimezone(zone),
        next_fire_at=nxt,
        last_fired_at=last.astimezone(zone) if last is not None else None,
    )


def _row(session: Session, principal: Principal, name: str, *, write: bool) -> BatchSchedule:
    """The schedule if ``principal`` may see it: admins and the owner manage it, members of
    its project may read it; to anyone else it does not exist."""
    row = session.scalar(select(BatchSchedule).where(BatchSchedule.name == name))
    if row is None or not (
        principal.is_admin
        or row.user_id == principal.user_id
        or principal.can_see_project(row.project_id)
    ):
        raise NotFound(f"no batch named {name!r}")
    if write and not (principal.is_admin or row.user_id == principal.user_id):
        raise Forbidden(f"batch {name!r} belongs to another user")
    return row


def list_batches(
    *, session: Session, principal: Principal, now: datetime, page: Page = Page()
) -> tuple[list[BatchOut], int]:
    """A page of the batches `principal` sees, by name, and how many they are."""
    query = select(BatchSchedule)
    if not principal.is_admin:
        query = query.where(
            or_(
                BatchSchedule.user_id == principal.user_id,
                BatchSchedule.project_id.in_(principal.project_ids or {-1}),
            )
        )
    rows = session.scalars(page.of(query.order_by(BatchSchedule.name)))
    return [_out(session, row, now, viewer=principal) for row in rows], count(session, query)


def get_batch(*, session: Session, principal: Principal, name: str, now: datetime) -> BatchOut:
    return _out(session, _row(session, principal, name, write=False), now, viewer=principal)


def list_firings(
    *, session: Session, principal: Principal, name: str, limit: int = 50
) -> tuple[list[FiringOut], int]:
    """The latest `limit`, newest first, times in the schedule's zone, and how many."""
    row = _row(session, principal, name, write=False)
    zone = _zone(row)
    query = select(BatchFiring).where(BatchFiring.schedule_id == row.id)
    firings = session.scalars(query.order_by(BatchFiring.fire_at.desc()).limit(limit))
    return [_firing_out(f, zone) for f in firings], count(session, query)


def _firing_out(firing: BatchFiring, zone: ZoneInfo) -> FiringOut:
    return FiringOut(
        fire_at=firing.fire_at.astimezone(zone),
        created_at=firing.created_at.astimezone(zone),
        skipped=firing.skipped,
        job_ids=list(firing.job_ids or []),
        error=firing.error,
        run_by=firing.run_by,
    )


# --------------------------------------------------------------------------- writing


def owner_principal(*, session: Session, user_id: int) -> Principal:
    """The schedule owner as a Principal, with memberships as they are now."""
    user = session.get(User, user_id)
    if user is None:
        raise NotFound(f"no user {user_id}")
    return principal_for(session=session, user=user)


def _check_templates(
    session: Session, owner: Principal, body: BatchIn, limits: RuntimeLimits
) -> tuple[list[dict[str, Any]], int]:
    """Validate the templates as job submissions by ``owner``; return them as stored (with
    the project resolved, so a later second membership cannot make them ambiguous) and the
    first template's project id. The default time limit is applied at each firing, not
    stored: a template follows the cluster's setting."""
    stored: list[dict[str, Any]] = []
    first_project: int | None = None
    for index, template in enumerate(body.templates):
        try:
            checked = check_submission(
                session=session, principal=owner, spec=template, limits=limits
            )
            later = [i for i in template.after if i >= index]
            if later:
                # Only an earlier template: its job exists when this one is made, and no
                # two templates can wait for each other.
                if index == 0:
                    may = "the first template cannot wait for another"
                elif index == 1:
                    may = "template 1 may wait for template 0"
                else:
                    may = f"template {index} may wait for templates 0 to {index - 1}"
                raise FieldError("after", f"template {later[0]} is not an earlier one: {may}")
        except FieldError as exc:
            raise TemplateFieldError(index, exc) from None
        data = template.model_dump(mode="json", exclude_unset=True)
        data["project"] = checked.project_name
        stored.append(data)
        if first_project is None:
            first_project = checked.project_id
    assert first_project is not None  # BatchIn requires one template at least
    return stored, first_project


_AUDITED = (
    "name",
    "cron",
    "timezone",
    "templates",
    "target",
    "window",
    "catch_up",
    "concurrency",
    "enabled",
)


def _settings(row: BatchSchedule) -> dict[str, Any]:
    """What the audit trail keeps of a batch: its fields as stored (the templates with
    their project resolved)."""
    return {name: getattr(row, name) for name in _AUDITED}


def create_batch(
    *, session: Session, principal: Principal, body: BatchIn, limits: RuntimeLimits, now: datetime
) -> BatchOut:
    """Create a schedule owned by ``principal``; it fires only for times after ``now``."""
    now = _utc(now)
    owner = owner_principal(session=session, user_id=principal.user_id)
    templates, project_id = _check_templates(session, owner, body, limits)
    if body.target == "offpeak":
        require_window(session=session, name=body.window, field="window")
    row = BatchSchedule(
        name=body.name,
        user_id=owner.user_id,
        project_id=project_id,
        cron=body.cron,
        timezone=body.timezone,
        templates=templates,
        target=body.target,
        window=body.window,
        catch_up=body.catch_up,
        concurrency=body.concurrency,
        enabled=body.enabled,
        active_from=now,
        created_at=now,
        updated_at=now,
    )
    session.add(row)
    record(
        session=session,
        actor=principal.name,
        action="batch.create",
        target=body.name,
        info=_settings(row),
    )
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise Conflict(f"a batch named {body.name!r} already exists") from None
    return _out(session, row, now, viewer=principal)


def replace_batch(
    *,
    session: Session,
    principal: Principal,
    name: str,
    body: BatchIn,
    limits: RuntimeLimits,
    now: datetime,
) -> BatchOut:
    """Replace a schedule (the owner stays). A new cron or zone, or re-enabling, starts
    afresh at ``now``: times before the change never fire."""
    now = _utc(now)
    row = _row(session, principal, name, write=True)
    owner = owner_principal(session=session, user_id=row.user_id)
    templates, project_id = _check_templates(session, owner, body, limits)
    if body.target == "offpeak":
        require_window(session=session, name=body.window, field="window")
    if body.cron != row.cron or body.timezone != row.timezone or (body.enabled and not row.enabled):
        row.active_from = now
    before = _settings(row)
    row.name = body.name
    row.cron = body.cron
    row.timezone = body.timezone
    row.templates = templates
    row.project_id = project_id
    row.target = body.target
    row.window = body.window
    row.catch_up = body.catch_up
    row.concurrency = body.concurrency
    row.enabled = body.enabled
    row.updated_at = now
    if changed := changes(before, _settings(row)):
        record(
            session=session, actor=principal.name, action="batch.replace", target=name, info=changed
        )
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise Conflict(f"a batch named {body.name!r} already exists") from None
    return _out(session, row, now, viewer=principal)


def set_enabled(
    *, session: Session, principal: Principal, name: str, enabled: bool, now: datetime
) -> BatchOut:
    """Idempotent. Re-enabling never fires for times while the schedule was disabled."""
    now = _utc(now)
    row = _row(session, principal, name, write=True)
    if enabled and not row.enabled:
        row.active_from = now
    if enabled != row.enabled:
        row.enabled = enabled
        row.updated_at = now
        action = "batch.enable" if enabled else "batch.disable"
        record(session=session, actor=principal.name, action=action, target=name)
        session.commit()
    return _out(session, row, now, viewer=principal)


def delete_batch(*, session: Session, principal: Principal, name: str) -> None:
    """Delete the schedule and its firing history; jobs it submitted stay."""
    row = _row(session, principal, name, write=True)
    # The firing history goes with it; the trail keeps who deleted what.
    record(
        session=session,
        actor=principal.name,
        action="batch.delete",
        target=name,
        info=_settings(row),
    )
    session.execute(delete(BatchFiring).where(BatchFiring.schedule_id == row.id))
    session.delete(row)
    session.commit()


# --------------------------------------------------------------------------- firing


@dataclass(frozen=True, slots=True)
class Firing:
    schedule: str
    fire_at: datetime
    outcome: str  # "submitted" | "skipped" | "failed" | "duplicate"
    job_ids: tuple[int, ...] = ()
    error: str | None = None
    # stop_job messages for running jobs of an earlier firing it replaced (after commit)
    stops: tuple[StopJob, ...] = ()


@dataclass
class FireReport:
    firings: list[Firing] = field(default_factory=list)

    @property
    def submitted_jobs(self) -> list[int]:
        return [j for f in self.firings if f.outcome == "submitted" for j in f.job_ids]

    def count(self, outcome: str) -> int:
        return sum(1 for f in self.firings if f.outcome == outcome)

    @property
    def after(self) -> AfterCommit:
        """Stop the running jobs the firings replaced; a cycle if jobs were submitted."""
        stops = [stop for firing in self.firings for stop in firing.stops]
        return AfterCommit.of(stops, cycle=bool(self.submitted_jobs))


def _job_spec(row: BatchSchedule, template: dict[str, Any], fired: list[int]) -> JobCreate:
    """The job `template` makes in a firing whose earlier templates made the jobs `fired`."""
    schedule: dict[str, Any] = {"mode": row.target}
    if row.window is not None:
        schedule["window"] = row.window
    labels = {"batch": row.name, **template.get("labels", {})}
    job = {k: v for k, v in template.items() if k != "after"}
    depends_on = [fired[i] for i in template.get("after", [])]
    return JobCreate.model_validate(
        {**job, "schedule": schedule, "labels": labels, "depends_on": depends_on}
    )


def _due(session: Session, row: BatchSchedule, now: datetime) -> datetime | None:
    """The fire time to handle at ``now``, if any (UTC)."""
    latest = session.scalar(
        select(BatchFiring.fire_at)
        .where(BatchFiring.schedule_id == row.id, BatchFiring.run_by.is_(None))
        .order_by(BatchFiring.fire_at.desc())
        .limit(1)
    )
    anchor = row.active_from if latest is None else max(row.active_from, latest)
    due = latest_fire_at_or_before(row.cron, _zone(row), now)
    if due is None or due.astimezone(UTC) <= anchor:
        return None
    return due.astimezone(UTC)


def _record_failure(
    factory: sessionmaker[Session], row_id: int, fire_at: datetime, now: datetime, error: str
) -> bool:
    """Record a due firing that could not submit, so it is not retried every check."""
    with factory() as session:
        session.add(
            BatchFiring(
                schedule_id=row_id,
                fire_at=fire_at,
                created_at=now,
                skipped=False,
                job_ids=[],
                error=error[:512],
            )
        )
        try:
            session.commit()
        except IntegrityError:
            session.rollback()
            return False
    return True


def fire_schedule(
    *,
    factory: sessionmaker[Session],
    schedule_id: int,
    limits: RuntimeLimits,
    now: datetime,
    check_interval_s: float = CHECK_INTERVAL_S,
) -> Firing | None:
    """Handle one schedule at ``now``: at most one firing, in its own transaction."""
    now = _utc(now)
    with factory() as session:
        row = session.get(BatchSchedule, schedule_id)
        if row is None or not row.enabled:
            return None
        due = _due(session, row, now)
        if due is None:
            return None
        name = row.name
        skip = row.catch_up == "skip" and (now - due).total_seconds() > late_tolerance_s(
            check_interval_s
        )
        firing = BatchFiring(
            schedule_id=row.id, fire_at=due, created_at=now, skipped=skip, job_ids=[]
        )
        session.add(firing)
        try:
            # The claim: a concurrent claimer blocks here until we commit, then fails.
            session.flush()
            if skip:
                session.commit()
                log.info("batch %s: fire time %s skipped (late)", name, due.isoformat())
                return Firing(name, due, "skipped")
            earlier = _unended_jobs(session, row)
            if earlier and row.concurrency == "forbid":
                firing.skipped = True
                firing.error = _overlap(earlier)
                session.commit()
                log.info("batch %s: fire time %s skipped: %s", name, due.isoformat(), firing.error)
                return Firing(name, due, "skipped", error=firing.error)
            why = f"replaced by the firing for {due.isoformat()}"
            stops = _replace(session, earlier, batch=name, why=why) if earlier else []
            job_ids = _submit_templates(
                session,
                row,
                limits=limits,
                actor=f"batch:{name}",
                reason=f"cron batch {name!r} fired for {due.isoformat()}",
            )
            firing.job_ids = job_ids
            session.commit()
        except IntegrityError:
            session.rollback()
            return Firing(name, due, "duplicate")
        except (DomainError, ValidationError) as exc:
            session.rollback()
            message = _failure(exc)
            log.warning("batch %s: firing %s failed: %s", name, due.isoformat(), message)
            if not _record_failure(factory, schedule_id, due, now, message):
                return Firing(name, due, "duplicate")
            return Firing(name, due, "failed", error=message)
    log.info("batch %s fired for %s: jobs %s", name, due.isoformat(), job_ids)
    return Firing(name, due, "submitted", tuple(job_ids), stops=tuple(stops))


def _failure(exc: DomainError | ValidationError) -> str:
    """Why a firing could not submit, located in its job when the check names a field."""
    if isinstance(exc, FieldError):
        return f"{'.'.join(exc.path)}: {exc.message}"
    return exc.message if isinstance(exc, DomainError) else str(exc)


def _unended_jobs(session: Session, row: BatchSchedule) -> list[Job]:
    """The jobs of the schedule's earlier firings that have not ended (none asked for
    under `allow`), rows locked in id order: a cycle may be placing them."""
    if row.concurrency == "allow":
        return []
    query = select(Job).where(Job.batch_id == row.id, Job.status.not_in(FINISHED))
    return list(session.scalars(query.order_by(Job.id).with_for_update()))


def _submit_templates(
    session: Session, row: BatchSchedule, *, limits: RuntimeLimits, actor: str, reason: str
) -> list[int]:
    """Submit one job per template, as the schedule's owner; returns their ids in order."""
    owner = owner_principal(session=session, user_id=row.user_id)
    job_ids: list[int] = []
    for template in row.templates:
        job, _ = create_job(
            session=session,
            principal=owner,
            spec=_job_spec(row, template, job_ids),
            limits=limits,
            actor=actor,
            reason=reason,
            batch_id=row.id,
        )
        job_ids.append(job.id)
    return job_ids


def _overlap(earlier: list[Job]) -> str:
    return f"jobs {_ids(earlier)} of an earlier firing have not ended (concurrency: forbid)"


def _replace(session: Session, jobs: list[Job], *, batch: str, why: str) -> list[StopJob]:
    """Cancel an earlier firing's jobs (`why`: for which firing); the stops for those
    placed are the caller's to send after its commit."""
    for job in jobs:
        cancel_locked(session, job=job, actor=f"batch:{batch}", why=why)
    log.info("batch %s: jobs %s %s", batch, _ids(jobs), why)
    placed = {job.id: job.attempt for job in jobs if job.cancel_requested_at is not None}
    return stop_orders(session, placed, reason="cancel")


def _ids(jobs: list[Job]) -> str:
    return ", ".join(str(job.id) for job in jobs)


def run_batch(
    *, session: Session, principal: Principal, name: str, limits: RuntimeLimits, now: datetime
) -> Changed[FiringOut]:
    """Submit the batch's jobs now, by hand (`kubectl create job --from=cronjob/NAME`),
    also while it is disabled. Its concurrency policy applies as at a fire time: `forbid`
    refuses (409) while jobs of an earlier firing have not ended, `replace` cancels them.
    The firing is recorded with `run_by`; the schedule's own fire times ignore it.
    Commits; after it, the caller stops the replaced running jobs and asks for a cycle."""
    now = _utc(now)
    row = _row(session, principal, name, write=True)
    earlier = _unended_jobs(session, row)
    if earlier and row.concurrency == "forbid":
        raise Conflict(f"{_overlap(earlier)}: cancel them or wait until they end")
    firing = BatchFiring(
        schedule_id=row.id,
        fire_at=now,
        created_at=now,
        skipped=False,
        job_ids=[],
        run_by=principal.name,
    )
    session.add(firing)
    why = f"replaced by a run of batch {name!r} by {principal.name}"
    stops = _replace(session, earlier, batch=name, why=why) if earlier else []
    try:
        firing.job_ids = _submit_templates(
            session,
            row,
            limits=limits,
            actor=principal.name,
            reason=f"batch {name!r} run by {principal.name}",
        )
    except (DomainError, ValidationError) as exc:
        # The templates were valid when stored; what changed since (the owner left the
        # project, a window was deleted) is the batch's state, not this request's body.
        session.rollback()  # nothing of the run stays: the replaced jobs are not cancelled
        raise Conflict(f"batch {name!r} cannot submit its jobs now: {_failure(exc)}") from None
    record(
        session=session,
        actor=principal.name,
        action="batch.run",
        target=name,
        info={"job_ids": firing.job_ids},
    )
    try:
        session.commit()
    except IntegrityError:  # a fire time of the same microsecond
        session.rollback()
        raise Conflict(f"batch {name!r} fired at this instant; run it again") from None
    log.info("batch %s run by %s: jobs %s", name, principal.name, firing.job_ids)
    return Changed(_firing_out(firing, _zone(row)), AfterCommit.of(stops, cycle=True))


def fire_due(
    *,
    factory: sessionmaker[Session],
    limits: RuntimeLimits,
    now: datetime,
    check_interval_s: float = CHECK_INTERVAL_S,
    only: Sequence[int] | None = None,
) -> FireReport:
    """Fire every enabled schedule that is due at ``now`` (one transaction each). The
    caller then sends `report.after`: stops for the running jobs a firing replaced, and a
    scheduling cycle if any job was submitted."""
    with factory() as session:
        query = select(BatchSchedule.id).where(BatchSchedule.enabled.is_(True))
        if only is not None:
            query = query.where(BatchSchedule.id.in_(only))
        ids = list(session.scalars(query.order_by(BatchSchedule.id)))
    report = FireReport()
    for schedule_id in ids:
        try:
            firing = fire_schedule(
                factory=factory,
                schedule_id=schedule_id,
                limits=limits,
                now=now,
                check_interval_s=check_interval_s,
            )
        except Exception:  # one broken schedule must not stop the others
            log.exception("batch schedule %s: firing failed", schedule_id)
            continue
        if firing is not None:
            report.firings.append(firing)
    return report
