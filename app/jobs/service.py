"""Submitting, reading, listing and cancelling jobs."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError
from sqlalchemy import ColumnElement, Select, and_, func, inspect, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.auth.models import User
from app.auth.service import Principal
from app.db import utcnow
from app.errors import Conflict, FieldError, Forbidden, NotFound
from app.estimator.catalog import job_memory_from_model
from app.jobs.arrays import (
    ARRAY_JOB_ID_ENV,
    ARRAY_TASK_COUNT_ENV,
    ARRAY_TASK_ID_ENV,
    MAX_TASKS,
)
from app.jobs.dependencies import (
    judge,
    load_dependencies,
    load_namesakes,
    singleton_wait,
)
from app.jobs.estimates import estimate_note
from app.jobs.lifecycle import note, transition
from app.jobs.limits import ProjectTimeLimit, RuntimeLimits, check_priority
from app.jobs.models import Allocation, Job, JobEvent
from app.jobs.orders import AfterCommit, Changed, stop_orders, time_limit_orders
from app.jobs.pending_limits import check_pending_limits
from app.jobs.schemas import (
    AllocationOut,
    ArrayOut,
    BulkOut,
    JobCreate,
    JobEventOut,
    JobOut,
    JobPage,
    JobUpdate,
    PendingPage,
    ScheduleSpec,
)
from app.jobs.states import (
    ACTIVE,
    ARRAY_LIMIT,
    DEPENDENCY,
    FINISHED,
    HELD,
    NEW_IN_QUEUE,
    SINGLETON,
    JobStatus,
)
from app.nodes.inventory import Inventory, InventoryCache, read_inventory
from app.nodes.models import Gpu, Node
from app.notifications.deliveries import NotificationOut, deliveries
from app.paging import Page, count
from app.projects.models import Project
from app.text import escape_controls
from app.windows.service import require_long_enough_opening, require_window
from app.wire import StopReason

MAX_PAGE = 500


@dataclass(frozen=True, slots=True)
class Submitted:
    job: JobOut
    created: bool  # False when an Idempotency-Key replayed an earlier submission

    @property
    def after(self) -> AfterCommit:
        return AfterCommit(cycle=self.created)  # beat would pick it up anyway


def _request_hash(spec: JobCreate) -> str:
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _resolve_project(
    *, session: Session, principal: Principal, name: str | None
) -> tuple[int, str, ProjectTimeLimit | None]:
    """(id, name, longest time limit) of the project a submission goes to; the user's own
    projects come from the principal, so the common case costs no query."""
    if name is None:
        if len(principal.projects) == 1:
            name = next(iter(principal.projects))
        else:
            raise FieldError(
                "project",
                "required: you belong to "
                + (", ".join(sorted(principal.projects)) or "no project"),
            )
    if name in principal.project_id_by_name:
        project_id = principal.project_id_by_name[name]
        max_s = principal.project_max_runtime_s.get(project_id)
    else:
        row = session.execute(
            select(Project.id, Project.max_runtime_s).where(Project.name == name)
        ).one_or_none()
        if row is None:
            raise FieldError("project", f"no project named {name!r}")
        project_id, max_s = row
        if not principal.can_see_project(project_id):
            raise FieldError("project", f"you are not a member of project {name!r}")
    return project_id, name, None if max_s is None else ProjectTimeLimit(name, max_s)


def spell_gpu_model(
    *, session: Session, spec: JobCreate, inventory: InventoryCache | None = None
) -> JobCreate:
    """`spec` with its GPU model as the cluster spells it (`gpu_model_named`), so that a
    script's `#SBATCH --gres=gpu:h100:2` runs on the cluster's 'NVIDIA H100 80GB HBM3'.
    A model that names none is left for `check_can_ever_fit` to refuse."""
    if spec.gpu_model is None:
        return spec
    found = None
    if inventory is not None:
        with suppress(FieldError):  # as there, the copy decides only when it finds one
            found = gpu_model_named(spec.gpu_model, inventory.get(session))
    if found is None:
        per_node = read_inventory(session) if inventory is None else inventory.refresh(session)
        found = gpu_model_named(spec.gpu_model, per_node)
    if found is None or found == spec.gpu_model:
        return spec
    return spec.model_copy(update={"gpu_model": found})


def gpu_model_named(asked: str, per_node: Inventory) -> str | None:
    """The cluster's GPU model that `asked` names: itself, else the only model whose name
    has `asked`'s words in a row, ignoring case and punctuation ('h100' and 'H100-80GB'
    both name 'NVIDIA H100 80GB HBM3'). Slurm's GRES types are short names an admin
    chose; ours are what NVML reports. None when nothing matches."""
    models = _models(per_node)
    if asked in models:
        return asked
    words = _words(asked)
    if not words:
        return None
    hits = [m for m in models if _has_in_a_row(_words(m), words)]
    if len(hits) > 1:
        raise FieldError("gpu_model", f"{asked!r} could be {' or '.join(hits)}: name one")
    return hits[0] if hits else None


def _models(per_node: Inventory) -> list[str]:
    return sorted({model for gpus in per_node.values() for model, _ in gpus})


def _words(text: str) -> list[str]:
    return re.findall(r"[0-9a-z]+", text.lower())


def _has_in_a_row(words: list[str], run: list[str]) -> bool:
    return any(words[i : i + len(run)] == run for i in range(len(words) - len(run) + 1))


def check_can_ever_fit(
    *, session: Session, spec: JobCreate, inventory: InventoryCache | None = None
) -> None:
    """Reject what no registered node could ever run; accept anything while none is
    registered. With `inventory`, a cached copy may say it fits; a refusal is always
    checked against the database as it is now."""
    if inventory is not None:
        try:
            return _check_fits(inventory.get(session), spec)
        except FieldError:
            pass  # the copy may be out of date: the database as it is now decides
    _check_fits(read_inventory(session) if inventory is None else inventory.refresh(session), spec)


def _check_fits(per_node: Inventory, spec: JobCreate) -> None:
    if not per_node:
        return
    largest_name, largest = max(per_node.items(), key=lambda item: (len(item[1]), item[0]))
    if spec.gpu_model is not None:
        models = _models(per_node)
        if spec.gpu_model not in models:
            raise FieldError(
                "gpu_model",
                f"no node has GPU model {spec.gpu_model!r}; available: {', '.join(models) or 'none'}",
            )

    def usable(gpus: list[tuple[str, int]]) -> list[int]:
        return [
            mem
            for model, mem in gpus
            if (spec.gpu_model is None or model == spec.gpu_model)
            and (spec.gpu_memory_mb is None or mem >= spec.gpu_memory_mb)
        ]

    if spec.gpus > len(largest):
        raise FieldError(
            "gpus",
            f"no node could ever fit {spec.gpus} GPUs: the largest node, {largest_name}, "
            f"has {len(largest)}{_spread_hint(per_node, spec)}",
        )
    if spec.gpu_memory_mb is not None:
        biggest = max((mem for gpus in per_node.values() for _, mem in gpus), default=0)
        if spec.gpu_memory_mb > biggest:
            raise FieldError(
                "gpu_memory_mb",
                f"no GPU has {spec.gpu_memory_mb} MiB; the largest has {biggest} MiB",
            )
    fitting_nodes = [name for name, gpus in per_node.items() if len(usable(gpus)) >= spec.gpus]
    if len(fitting_nodes) < spec.nodes:
        raise FieldError(
            "nodes",
            f"{spec.nodes} nodes with {spec.gpus} matching GPUs each requested; "
            f"only {len(fitting_nodes)} node(s) could ever fit (largest node: {largest_name}, "
            f"{len(largest)} GPUs)",
        )
    if spec.only_nodes is not None or spec.exclude_nodes:
        _check_node_choice(spec, sorted(per_node), fitting_nodes)


def _spread_hint(per_node: Inventory, spec: JobCreate) -> str:
    """`gpus` counts per node (Slurm's --gpus counts in all): for a one-node job too big
    for any node, the fewest nodes that hold as many GPUs between them, if the cluster has
    them."""
    if spec.nodes != 1:
        return ""
    sizes = sorted((len(gpus) for gpus in per_node.values()), reverse=True)
    for nodes in range(2, len(sizes) + 1):
        per = spec.gpus // nodes
        if per * nodes == spec.gpus and sizes[nodes - 1] >= per:
            return (
                f"; gpus counts per node: {nodes} nodes with {per} GPUs each would "
                f"(nodes={nodes}, gpus={per})"
            )
    return ""


def _check_node_choice(spec: JobCreate, names: list[str], fitting_nodes: list[str]) -> None:
    """The nodes a job names exist, and enough of those it may use could ever fit it."""
    for field in ("only_nodes", "exclude_nodes"):
        unknown = sorted(set(getattr(spec, field) or ()) - set(names))
        if unknown:
            raise FieldError(
                field, f"no node named {', '.join(unknown)}; nodes: {', '.join(names)}"
            )
    may_use = [
        n
        for n in fitting_nodes
        if n not in spec.exclude_nodes and (spec.only_nodes is None or n in spec.only_nodes)
    ]
    if len(may_use) < spec.nodes:
        field = "only_nodes" if spec.only_nodes is not None else "exclude_nodes"
        fits = f"only {', '.join(sorted(may_use))}" if may_use else "none"
        raise FieldError(
            field,
            f"{spec.nodes} node(s) with {spec.gpus} matching GPUs each requested; of the "
            f"nodes it may use, {fits} could ever fit",
        )


def _with_default_notify_url(spec: JobCreate, principal: Principal) -> JobCreate:
    """A job that asks for notifications (`notify_on`) without a URL of its own sends them
    to its user's default, as Slurm mails the submitting user."""
    if spec.notify_url is not None or "notify_on" not in spec.model_fields_set:
        return spec
    url = _default_notify_url(principal.notify_url, whose="your")
    return spec.model_copy(update={"notify_url": url})


def _default_notify_url(default: str | None, *, whose: str) -> str:
    if default is None:
        raise FieldError(
            "notify_url",
            f"notify_on needs a notify_url: give one, or set {whose} default (gpusched me "
            "--notify URL, PATCH /api/v1/me)",
        )
    return default


@dataclass(frozen=True, slots=True)
class CheckedSubmission:
    spec: JobCreate  # with the default time limit applied and the memory a model needs
    project_id: int
    project_name: str


def check_submission(
    *,
    session: Session,
    principal: Principal,
    spec: JobCreate,
    limits: RuntimeLimits,
    inventory: InventoryCache | None = None,
) -> CheckedSubmission:
    """Every check a submission by `principal` must pass before a job is made (a
    FieldError names the field). A batch runs it on its templates when it is made, so a
    template that every firing would refuse is refused then, and a new rule added here
    applies to both."""
    project_id, project_name, project_limit = _resolve_project(
        session=session, principal=principal, name=spec.project
    )
    spec = limits.apply(_with_default_notify_url(spec, principal), project=project_limit)
    spec = spell_gpu_model(session=session, spec=spec, inventory=inventory)
    if spec.model is not None and spec.gpu_memory_mb is None:
        memory = job_memory_from_model(
            session=session,
            model=spec.model,
            gpus=spec.gpus,
            nodes=spec.nodes,
            gpu_model=spec.gpu_model,
        )
        spec = spec.model_copy(update={"gpu_memory_mb": memory})
    _check_priority(session, principal=principal, project_id=project_id, asked=spec.priority)
    check_can_ever_fit(session=session, spec=spec, inventory=inventory)
    if spec.schedule.mode == "offpeak":
        require_window(session=session, name=spec.schedule.window, field=("schedule", "window"))
        _refuse_if_never_in_window(
            session, spec=spec, window=spec.schedule.window, preemptible=spec.preemptible
        )
    _check_singleton(spec)
    return CheckedSubmission(spec=spec, project_id=project_id, project_name=project_name)


def _refuse_if_never_in_window(
    session: Session, *, spec: JobCreate, window: str | None, preemptible: bool
) -> None:
    """An off-peak job that is not preemptible and lasts (its estimate, else its time limit)
    longer than every opening of its window(s) would never start: a 422 on that field."""
    require_long_enough_opening(
        session=session,
        name=window,
        runtime_s=spec.estimated_runtime_s or spec.max_runtime_s,
        preemptible=preemptible,
        field="estimated_runtime_s" if spec.estimated_runtime_s else "max_runtime_s",
        now=utcnow(),
    )


def _check_priority(
    session: Session, *, principal: Principal, project_id: int, asked: int, current: int = 0
) -> None:
    """A 403 unless `principal` may give a job of the project priority `asked` (see
    check_priority); admins may give any. Reads the project only for a raise."""
    if principal.is_admin or asked <= max(current, 0):
        return
    name, project_max = session.execute(
        select(Project.name, Project.max_priority).where(Project.id == project_id)
    ).one()
    check_priority(asked=asked, project=name, project_max=project_max, current=current)


def create_job(
    *,
    session: Session,
    principal: Principal,
    spec: JobCreate,
    limits: RuntimeLimits,
    idempotency_key: str | None = None,
    actor: str | None = None,
    reason: str = "submitted",
    inventory: InventoryCache | None = None,
    batch_id: int | None = None,
) -> tuple[Job, str]:
    """Validate and add a PENDING job with its first event, or one per task of an array
    (returning the first task); flushes, never commits, so a caller can submit several
    jobs atomically (cron batches, which pass their `batch_id`)."""
    request_hash = _request_hash(spec)  # of the body as sent: idempotent replays compare it
    checked = check_submission(
        session=session, principal=principal, spec=spec, limits=limits, inventory=inventory
    )
    spec, project_id, project_name = checked.spec, checked.project_id, checked.project_name
    name = spec.name or _default_name(spec.command)
    if spec.dependency == SINGLETON:
        depends_on: list[int] = []
        waits_for = _singleton_wait(session=session, principal=principal, spec=spec, name=name)
    else:
        depends_on = _with_array_tasks(session=session, ids=spec.depends_on)
        waits_for = _dependencies_left(
            session=session, principal=principal, ids=depends_on, kind=spec.dependency
        )
    indices: tuple[int | None, ...] = (None,) if spec.array is None else spec.array.task_indices
    check_pending_limits(
        session=session,
        user_id=principal.user_id,
        project_id=project_id,
        adding=len(indices),
        user_default=limits.max_pending_per_user,
    )
    now = utcnow()
    tasks = [
        Job(
            name=name,
            user_id=principal.user_id,
            project_id=project_id,
            command=spec.command,
            script=spec.script,
            workdir=spec.workdir,
            env=dict(spec.env),
            gpus=spec.gpus,
            gpu_memory_mb=spec.gpu_memory_mb,
            gpu_share_milli=spec.share_milli,
            gpu_model=spec.gpu_model,
            nodes=spec.nodes,
            priority=spec.priority,
            max_runtime_s=spec.max_runtime_s,
            estimated_runtime_s=spec.estimated_runtime_s,
            grace_s=spec.grace_s,
            retries=spec.retries,
            failures=0,
            preemptible=spec.preemptible,
            schedule_mode=spec.schedule.mode,
            begin_at=spec.schedule.at,  # already UTC (ScheduleSpec)
            window=spec.schedule.window,
            labels=spec.labels,
            only_nodes=spec.only_nodes,
            exclude_nodes=spec.exclude_nodes,
            notify_url=spec.notify_url,
            notify_on=spec.notify_on,
            held_by=(actor or principal.name) if spec.hold else None,
            held_at=now if spec.hold else None,
            depends_on=depends_on,
            dependency_kind=spec.dependency,
            dependencies_met=waits_for is None,
            array_index=index,
            batch_id=batch_id,
            status=JobStatus.PENDING,
            attempt=0,
            pending_reason=NEW_IN_QUEUE if waits_for is None else DEPENDENCY,
            pending_message=waits_for or "waiting for the next scheduling cycle",
            created_at=now,
            updated_at=now,
            # Only the first task carries the key: a replay returns it, as the first
            # submission did.
            idempotency_key=idempotency_key if position == 0 else None,
            request_hash=request_hash if position == 0 else None,
        )
        for position, index in enumerate(indices)
    ]
    session.add_all(tasks)
    session.flush()
    if spec.array is not None:
        _number_tasks(tasks, max_running=spec.array.max_running)
    session.add_all(
        JobEvent(
            job_id=job.id,
            at=now,
            from_status=None,
            to_status=JobStatus.PENDING,
            attempt=0,
            actor=actor or principal.name,
            reason=f"{reason}, held" if spec.hold else reason,
        )
        for job in tasks
    )
    return tasks[0], project_name


def _number_tasks(tasks: list[Job], *, max_running: int | None) -> None:
    """Make `tasks` (just flushed, so with ids) one array named by the first one's id."""
    for job in tasks:
        job.array_id = tasks[0].id
        job.array_size = len(tasks)
        job.array_max_running = max_running
        job.env = {
            **job.env,
            ARRAY_JOB_ID_ENV: str(tasks[0].id),
            ARRAY_TASK_ID_ENV: str(job.array_index),
            ARRAY_TASK_COUNT_ENV: str(len(tasks)),
        }


def _with_array_tasks(*, session: Session, ids: list[int]) -> list[int]:
    """Depending on an array's id (its first task) is depending on every task of it, as
    `--dependency=afterok:<array job id>` is in Slurm."""
    if not ids:
        return ids
    arrays = set(
        session.scalars(select(Job.id).where(Job.id.in_(ids), Job.array_id == Job.id)).all()
    )
    if not arrays:
        return ids
    by_array: dict[int, list[int]] = {}
    for array_id, task_id in session.execute(
        select(Job.array_id, Job.id).where(Job.array_id.in_(arrays)).order_by(Job.id)
    ):
        by_array.setdefault(array_id or task_id, []).append(task_id)
    expanded = list(dict.fromkeys(task for i in ids for task in by_array.get(i, [i])))
    if len(expanded) > MAX_TASKS:
        raise FieldError(
            "depends_on",
            f"names {len(expanded)} jobs, counting each array's tasks; at most {MAX_TASKS}",
        )
    return expanded


def _check_singleton(spec: JobCreate) -> None:
    """A singleton names no jobs and is no array: a 422 on the field that says otherwise."""
    if spec.dependency != SINGLETON:
        return
    if spec.depends_on:
        raise FieldError(
            "depends_on",
            "a singleton job names no jobs: it waits for your other jobs of the same name",
        )
    if spec.array is not None:
        raise FieldError(
            "dependency",
            "singleton does not apply to an array: give it max_running 1 to run its tasks "
            "one at a time",
        )


def _singleton_wait(
    *, session: Session, principal: Principal, spec: JobCreate, name: str
) -> str | None:
    """Why a singleton job must wait as it is submitted (see singleton_wait), or None."""
    namesakes = load_namesakes(session, users=[principal.user_id], names=[name])
    return singleton_wait(None, name, namesakes.get((principal.user_id, name), []))


def _dependencies_left(
    *, session: Session, principal: Principal, ids: list[int], kind: str
) -> str | None:
    """Why a job depending on `ids` must wait, or None when they have all succeeded. A job
    the caller cannot see is treated as missing (its existence is not theirs to learn)."""
    if not ids:
        return None
    projects = dict(session.execute(select(Job.id, Job.project_id).where(Job.id.in_(ids))).all())
    unseen = [i for i in ids if i not in projects or not principal.can_see_project(projects[i])]
    if unseen:
        raise FieldError("depends_on", f"no job {unseen[0]} in your projects")
    verdict = judge(ids, load_dependencies(session, ids), kind)
    if verdict.broken:
        raise FieldError("depends_on", f"{verdict.message}, so this job could never start")
    return None if verdict.met else verdict.message


def submit(
    *,
    session: Session,
    principal: Principal,
    spec: JobCreate,
    limits: RuntimeLimits,
    idempotency_key: str | None,
    inventory: InventoryCache | None = None,
) -> Submitted:
    request_hash = _request_hash(spec)
    if idempotency_key is not None:
        replay = _idempotent_replay(
            session=session, principal=principal, key=idempotency_key, request_hash=request_hash
        )
        if replay is not None:
            return Submitted(job=replay, created=False)
    try:
        job, project_name = create_job(
            session=session,
            principal=principal,
            spec=spec,
            limits=limits,
            idempotency_key=idempotency_key,
            inventory=inventory,
        )
        session.commit()
    except IntegrityError:
        # Two identical requests raced on the same Idempotency-Key: the other one won.
        session.rollback()
        if idempotency_key is None:
            raise
        replay = _idempotent_replay(
            session=session, principal=principal, key=idempotency_key, request_hash=request_hash
        )
        if replay is None:
            raise
        return Submitted(job=replay, created=False)
    return Submitted(
        job=_to_out(job, user=principal.name, project=project_name, allocations=[]), created=True
    )


def _default_name(command: list[str] | str) -> str:
    """The program's file name, as squeue names a job by its script; a control character
    in it is written out (`\x1b`), as a name given would be refused for it."""
    first = command[0] if isinstance(command, list) else command.split()[0]
    return escape_controls(first.rsplit("/", 1)[-1])[:200].strip() or "job"


def _idempotent_replay(
    *, session: Session, principal: Principal, key: str, request_hash: str
) -> JobOut | None:
    job = session.scalar(
        select(Job).where(Job.user_id == principal.user_id, Job.idempotency_key == key)
    )
    if job is None:
        return None
    if job.request_hash != request_hash:
        raise Conflict(
            f"Idempotency-Key {key!r} was already used for job {job.id} with a different body"
        )
    return _outs(session, [job], viewer=principal)[0]


def get(*, session: Session, principal: Principal, job_id: int) -> JobOut:
    job = _visible_job(session=session, principal=principal, job_id=job_id)
    return _outs(session, [job], viewer=principal)[0]


def _visible_job(*, session: Session, principal: Principal, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    if not principal.can_see_project(job.project_id):
        raise Forbidden(f"job {job_id} belongs to a project you are not a member of")
    return job


def script(*, session: Session, principal: Principal, job_id: int) -> str:
    """The script a job runs: its text at submission (Slurm's `scontrol write batch_script`)."""
    job = _visible_job(session=session, principal=principal, job_id=job_id)
    if job.script is None:
        raise NotFound(
            f"job {job_id} has no script copy: it runs its command as it is when it starts"
        )
    return job.script


def events(
    *, session: Session, principal: Principal, job_id: int, page: Page = Page()
) -> tuple[list[JobEventOut], int]:
    """A page of the job's events, oldest first, and how many it has."""
    job = _visible_job(session=session, principal=principal, job_id=job_id)
    query = select(JobEvent).where(JobEvent.job_id == job.id)
    rows = session.scalars(page.of(query.order_by(JobEvent.id)))
    return [
        JobEventOut(
            id=e.id,
            at=e.at,
            from_status=e.from_status,
            to_status=e.to_status,
            attempt=e.attempt,
            actor=e.actor,
            reason=e.reason,
        )
        for e in rows
    ], count(session, query)


def notifications(
    *, session: Session, principal: Principal, job_id: int, page: Page = Page()
) -> tuple[list[NotificationOut], int]:
    job = _visible_job(session=session, principal=principal, job_id=job_id)
    return deliveries(session=session, job_id=job.id, page=page)


@dataclass(frozen=True, slots=True)
class JobSelection:
    """Which jobs a listing or a bulk cancel means (as squeue's and scancel's filters):
    every filter given must hold. Only jobs of the caller's projects are ever selected."""

    statuses: tuple[JobStatus, ...] = ()
    project: str | None = None
    user: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    array: int | None = None
    name: str | None = None

    def narrows(self) -> bool:
        given = (self.project, self.user, self.array, self.name)
        return bool(self.statuses or self.labels) or any(v is not None for v in given)

    def where(self, query: Select[Job], principal: Principal) -> Select[Job]:
        if not principal.is_admin:
            query = query.where(Job.project_id.in_(principal.project_ids or {-1}))
        if self.statuses:
            query = query.where(Job.status.in_(self.statuses))
        if self.project is not None:
            query = query.where(
                Job.project_id.in_(select(Project.id).where(Project.name == self.project))
            )
        if self.user is not None:
            query = query.where(Job.user_id.in_(select(User.id).where(User.name == self.user)))
        for key, value in self.labels:
            query = query.where(Job.labels[key].as_string() == value)
        if self.array is not None:
            query = query.where(Job.array_id == self.array)
        if self.name is not None:
            query = query.where(Job.name == self.name)
        return query


def list_jobs(
    *,
    session: Session,
    principal: Principal,
    selection: JobSelection = JobSelection(),
    cursor: int | None = None,
    limit: int = 50,
) -> JobPage:
    """Newest first. The cursor is the last id seen: new jobs get higher ids, so paging
    backwards never skips or repeats a job however many are submitted meanwhile."""
    query = selection.where(select(Job).order_by(Job.id.desc()).limit(limit + 1), principal)
    if cursor is not None:
        query = query.where(Job.id < cursor)
    jobs = list(session.scalars(query))
    more = len(jobs) > limit
    jobs = jobs[:limit]
    return JobPage(
        items=_outs(session, jobs, viewer=principal), next_cursor=str(jobs[-1].id) if more else None
    )


# Waiting jobs that cannot run yet whatever the GPUs do: held, waiting for their
# dependencies, their array's limit, their begin time or their off-peak window (the gate's
# reason carries no position; the core's "does not fit before the close" has one).
_LATER_REASONS = (DEPENDENCY, ARRAY_LIMIT, "begin_time")
NOT_YET_ELIGIBLE = or_(
    Job.held_by.is_not(None),
    Job.dependencies_met.is_(False),
    Job.pending_reason.in_(_LATER_REASONS),
    and_(Job.pending_reason == "window_closed", Job.queue_position.is_(None)),
)
# Its complement, without NOT over nullable columns (NOT NULL is not true).
ELIGIBLE_NOW = and_(
    Job.held_by.is_(None),
    Job.dependencies_met.is_(True),
    or_(Job.pending_reason.is_(None), Job.pending_reason.not_in(_LATER_REASONS)),
    or_(Job.pending_reason.is_distinct_from("window_closed"), Job.queue_position.is_not(None)),
)


def pending_in_order(
    *,
    session: Session,
    principal: Principal,
    filters: JobSelection = JobSelection(),
    offset: int = 0,
    limit: int = 50,
    eligible: bool | None = None,
) -> PendingPage:
    """Waiting jobs in the order the last cycle would serve them (queue position), held
    jobs last. `filters`' statuses are not used: these are the pending jobs. `eligible`:
    only those that may run now (True) or only those that cannot yet (False: held,
    dependencies, begin time, window, array limit), as Slurm lists them apart."""
    query = replace(filters, statuses=(JobStatus.PENDING,)).where(select(Job), principal)
    if eligible is not None:
        query = query.where(ELIGIBLE_NOW if eligible else NOT_YET_ELIGIBLE)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    jobs = session.scalars(
        query.order_by(
            Job.held_by.is_not(None), Job.queue_position.is_(None), Job.queue_position, Job.id
        )
        .offset(offset)
        .limit(limit)
    ).all()
    return PendingPage(total=total, items=_outs(session, jobs, viewer=principal))


def cancel(
    *, session: Session, principal: Principal, job_id: int, grace_s: int | None = None
) -> Changed[JobOut]:
    """Idempotent. A pending job ends at once; a scheduled or running one is stopped by its
    agent, which then reports CANCELLED (so its GPUs free up only when the process is gone);
    one already stopping is stopped again (a shorter grace cuts its own short). `grace_s`
    shortens the stop's grace period: noted on the job."""
    job = _visible_job(session=session, principal=principal, job_id=job_id)
    # Lock the row: a cycle placing this job at the same moment must not be overwritten.
    session.refresh(job, with_for_update=True)
    if job.status in FINISHED and job.status is not JobStatus.CANCELLED:
        raise Conflict(f"job {job_id} already finished ({job.status}); nothing to cancel")
    cancel_locked(session, job=job, actor=principal.name, grace_s=grace_s)
    after = _stops(session, [job], reason="cancel", grace_s=grace_s)
    session.commit()
    return Changed(_outs(session, [job], viewer=principal)[0], after)


def cancel_selected(
    *,
    session: Session,
    principal: Principal,
    selection: JobSelection,
    grace_s: int | None = None,
) -> Changed[BulkOut]:
    """Cancel every job the selection names that has not ended, in one transaction, as
    `scancel -u alice -t PENDING` or `scancel` of an array id. Returns how many and which
    (those placed are stopping), and the stops of those placed."""
    where = (Job.status.not_in(FINISHED),)
    ids = _lock_selected(
        session, principal=principal, selection=selection, verb="cancel", where=where
    )
    placed: dict[int, int] = {}
    stopping = 0
    for jobs in _in_chunks(session, ids):
        for job in jobs:
            cancel_locked(session, job=job, actor=principal.name, grace_s=grace_s)
            if job.status in ACTIVE:
                placed[job.id] = job.attempt
            stopping += job.status is not JobStatus.CANCELLED
    after = AfterCommit.of(stop_orders(session, placed, reason="cancel", grace_s=grace_s))
    session.commit()
    return Changed(BulkOut.of(ids, stopping=stopping), after)


def _stops(
    session: Session, jobs: Sequence[Job], *, reason: StopReason, grace_s: int | None = None
) -> AfterCommit:
    """stop_job to every node of the placed ones among `jobs`, after the commit."""
    placed = {job.id: job.attempt for job in jobs if job.status in ACTIVE}
    return AfterCommit.of(stop_orders(session, placed, reason=reason, grace_s=grace_s))


def _lock_selected(
    session: Session,
    *,
    principal: Principal,
    selection: JobSelection,
    verb: str,
    where: Sequence[ColumnElement[bool]],
) -> list[int]:
    """The ids of a bulk action's jobs, their rows locked in id order (as a cycle's apply
    locks them). A selection of every job is refused: a forgotten filter must not act on
    the whole queue."""
    if not selection.narrows():
        raise FieldError(
            "status",
            f"select the jobs to {verb} with status, project, user, label, array or name",
            location="query",
        )
    query = selection.where(select(Job.id), principal).where(*where)
    return list(session.scalars(query.order_by(Job.id).with_for_update(of=Job)))


# How many jobs a bulk action holds as objects at once.
BULK_CHUNK = 500


def _in_chunks(session: Session, ids: Sequence[int]) -> Iterator[list[Job]]:
    """The jobs of `ids` (locked by the caller), a chunk at a time: what the caller changes
    in one is written (flushed, in the caller's transaction) before the next is loaded,
    and the session lets go of the objects. Loading 20,000 jobs and their events at once
    left the API process 80 MB larger for good (bench/deep_queue.py)."""
    before = set(session.identity_map.keys())
    for start in range(0, len(ids), BULK_CHUNK):
        jobs = list(
            session.scalars(
                select(Job).where(Job.id.in_(ids[start : start + BULK_CHUNK])).order_by(Job.id)
            )
        )
        yield jobs
        session.flush()
        # The chunk's jobs and what acting on them added (events, notifications).
        for obj in list(session.identity_map.values()):
            if inspect(obj).key not in before:
                session.expunge(obj)


def cancel_locked(
    session: Session, *, job: Job, actor: str, grace_s: int | None = None, why: str | None = None
) -> None:
    """Cancel a job whose row the caller holds locked (a cycle may be placing it); a
    finished one is left alone. A placed one is only asked to stop: the caller sends
    its `stop_orders` after its commit. `why` is noted when it is not the user's cancel."""
    status = JobStatus(job.status)
    if status in (JobStatus.PENDING, JobStatus.PREEMPTED, JobStatus.LOST):
        if status is not JobStatus.PENDING:
            transition(session, job=job, to=JobStatus.PENDING, actor=actor, reason="")
        reason = "cancelled by user" if why is None else f"cancelled: {why}"
        transition(session, job=job, to=JobStatus.CANCELLED, actor=actor, reason=reason)
    elif status in ACTIVE:
        shorter = {None: "", 0: " (SIGKILL now)"}.get(grace_s, f" (grace at most {grace_s}s)")
        if grace_s is not None:
            earlier = job.cancel_grace_s
            job.cancel_grace_s = grace_s if earlier is None else min(earlier, grace_s)
        if job.cancel_requested_at is None:
            job.cancel_requested_at = utcnow()
            cause = "" if why is None else f" ({why})"
            reason = f"cancel requested{cause}; stopping the process{shorter}"
            note(session, job=job, actor=actor, reason=reason)
        elif shorter:
            note(session, job=job, actor=actor, reason=f"cancel again{shorter}")


def requeue(*, session: Session, principal: Principal, job_id: int, hold: bool) -> Changed[JobOut]:
    """Stop a placed or running job and put it back in the queue, as `scontrol requeue`:
    its agent stops it as a preemption (SIGTERM, its grace period to checkpoint, SIGKILL;
    one not started yet never starts), which costs no retry, and it waits again with its
    age kept. With `hold` it comes back held (`scontrol requeuehold`): change it
    (`gpusched update`), then release it. The caller sends the stop. Idempotent."""
    job = _visible_job(session=session, principal=principal, job_id=job_id)
    session.refresh(job, with_for_update=True)  # a finish report now must not race
    if job.status not in ACTIVE:
        raise Conflict(
            f"job {job_id} is {job.status}: only a placed or running job can be requeued"
        )
    if job.cancel_requested_at is not None:
        raise Conflict(f"job {job_id} is being cancelled: it will not come back")
    _ask_requeue(session, job=job, actor=principal.name, hold=hold)
    after = _stops(session, [job], reason="requeue")
    session.commit()
    return Changed(_outs(session, [job], viewer=principal)[0], after)


def requeue_node_jobs(
    *, session: Session, principal: Principal, node: str
) -> Changed[list[JobOut]]:
    """Requeue every job placed or running on `node`, for an admin (the router checks)
    moving work off a node to service it, after draining it: each is stopped with its
    grace period and comes back to the queue. Jobs being cancelled are left to end. The
    caller sends the stops."""
    if session.scalar(select(Node.id).where(Node.name == node)) is None:
        raise NotFound(f"no node {node!r}")
    jobs = session.scalars(
        select(Job)
        .where(
            Job.status.in_(ACTIVE),
            Job.cancel_requested_at.is_(None),
            Job.id.in_(
                select(Allocation.job_id)
                .join(Node, Node.id == Allocation.node_id)
                .where(Node.name == node, Allocation.released_at.is_(None))
            ),
        )
        .order_by(Job.id)
        .with_for_update()
    ).all()
    for job in jobs:
        _ask_requeue(session, job=job, actor=principal.name, hold=False, why=f"node {node}")
    after = _stops(session, jobs, reason="requeue")
    session.commit()
    return Changed(_outs(session, list(jobs), viewer=principal), after)


def _ask_requeue(
    session: Session, *, job: Job, actor: str, hold: bool, why: str | None = None
) -> None:
    """Mark a placed or running job to be stopped and requeued (once), noting who asked
    and why."""
    now = utcnow()
    if hold and job.held_by is None:
        job.held_by, job.held_at = actor, now
        note(session, job=job, actor=actor, reason=f"held by {actor}")
    if job.preempt_requested_at is None:
        job.preempt_requested_at = now
        cause = f" ({why})" if why else ""
        reason = f"requeue requested by {actor}{cause}; stopping the process"
        note(session, job=job, actor=actor, reason=reason)


def hold(*, session: Session, principal: Principal, job_id: int) -> JobOut:
    """Keep a pending job out of scheduling until it is released, as `scontrol hold`: it
    stays pending, but no cycle ranks or places it, and the time held does not count as
    waiting (else holding a job for a day would put it first as starving). Idempotent."""
    job = _visible_job(session=session, principal=principal, job_id=job_id)
    session.refresh(job, with_for_update=True)  # a cycle placing it now must not race
    if job.status is not JobStatus.PENDING:
        raise Conflict(f"job {job_id} is {job.status}: only a pending job can be held")
    _hold_one(session, job=job, actor=principal.name)
    session.commit()
    return _outs(session, [job], viewer=principal)[0]


def hold_selected(*, session: Session, principal: Principal, selection: JobSelection) -> BulkOut:
    """Hold every pending job the selection names, in one transaction, as `scontrol hold`
    of an array id. Jobs not pending are not selected. Returns how many and which."""
    where = (Job.status == JobStatus.PENDING,)
    ids = _lock_selected(
        session, principal=principal, selection=selection, verb="hold", where=where
    )
    for jobs in _in_chunks(session, ids):
        for job in jobs:
            _hold_one(session, job=job, actor=principal.name)
    session.commit()
    return BulkOut.of(ids)


def _hold_one(session: Session, *, job: Job, actor: str) -> None:
    if job.held_by is None:
        job.held_by, job.held_at = actor, utcnow()
        note(session, job=job, actor=actor, reason=f"held by {actor}")


def release(*, session: Session, principal: Principal, job_id: int) -> Changed[JobOut]:
    """Let a held job be scheduled again (`scontrol release`). A hold an admin placed is
    released only by an admin, as Slurm's admin hold. Idempotent."""
    job = _visible_job(session=session, principal=principal, job_id=job_id)
    session.refresh(job, with_for_update=True)
    if job.held_by is not None:
        if _held_by_admin(session, principal=principal, jobs=[job]):
            raise Forbidden(
                f"job {job_id} was held by admin {job.held_by!r}; only an admin releases it"
            )
        _release_one(session, job=job, actor=principal.name)
    session.commit()
    return Changed(_outs(session, [job], viewer=principal)[0], AfterCommit(cycle=True))


def release_selected(
    *, session: Session, principal: Principal, selection: JobSelection
) -> Changed[BulkOut]:
    """Release every held job the selection names, in one transaction (`scontrol release`
    of an array id). If an admin held any of them and the caller is not one, none is
    released: the 403 names them. Returns how many and which were released."""
    where = (Job.status == JobStatus.PENDING, Job.held_by.is_not(None))
    ids = _lock_selected(
        session, principal=principal, selection=selection, verb="release", where=where
    )
    if refused := _held_by_admin_ids(session, principal=principal, ids=ids):
        listed = ", ".join(map(str, refused))
        raise Forbidden(
            f"jobs {listed} were held by an admin; only an admin releases them (nothing was "
            "released: leave them out of the selection)"
        )
    for jobs in _in_chunks(session, ids):
        for job in jobs:
            _release_one(session, job=job, actor=principal.name)
    session.commit()
    return Changed(BulkOut.of(ids), AfterCommit(cycle=bool(ids)))


def _held_by_admin(session: Session, *, principal: Principal, jobs: list[Job]) -> list[Job]:
    """The jobs among `jobs` that an admin other than the caller holds, which only an
    admin may release (none when the caller is one)."""
    holders = {job.held_by for job in jobs} - {None, principal.name}
    if principal.is_admin or not holders:
        return []
    admins = set(session.scalars(select(User.name).where(User.name.in_(holders), User.is_admin)))
    return [job for job in jobs if job.held_by in admins]


def _held_by_admin_ids(session: Session, *, principal: Principal, ids: list[int]) -> list[int]:
    """`_held_by_admin` for a bulk release's jobs, by their ids (in id order)."""
    if principal.is_admin or not ids:
        return []
    refused: list[int] = []
    for start in range(0, len(ids), BULK_CHUNK):
        refused.extend(
            session.scalars(
                select(Job.id)
                .join(User, User.name == Job.held_by)
                .where(
                    Job.id.in_(ids[start : start + BULK_CHUNK]),
                    User.is_admin,
                    Job.held_by != principal.name,
                )
                .order_by(Job.id)
            )
        )
    return refused


def _release_one(session: Session, *, job: Job, actor: str) -> None:
    """Release a held job whose row the caller holds locked."""
    if job.held_at is not None:
        job.ineligible_s += max(0, int((utcnow() - job.held_at).total_seconds()))
    job.held_by = job.held_at = None
    _back_in_line(job, why="released")
    note(session, job=job, actor=actor, reason=f"released by {actor}")


def update(
    *,
    session: Session,
    principal: Principal,
    job_id: int,
    changes: JobUpdate,
    limits: RuntimeLimits,
) -> Changed[JobOut]:
    """Change a pending job's request, as `scontrol update`: checked as a submission is
    (ranges, time limits, whether it could ever fit). It keeps its submit time, so its
    age; the next cycle ranks it anew. Cancel and resubmit would lose both. A placed
    job's new time limit goes to its agents after the commit."""
    job = _visible_job(session=session, principal=principal, job_id=job_id)
    session.refresh(job, with_for_update=True)  # a cycle placing it now must not race
    if job.status in ACTIVE:
        _change_placed_limit(session, principal=principal, job=job, changes=changes, limits=limits)
        after = AfterCommit.of(time_limit_orders(session, job=job))
    elif job.status is JobStatus.PENDING:
        _update_locked(session, principal=principal, job=job, changes=changes, limits=limits)
        after = AfterCommit(cycle=True)
    else:
        raise Conflict(f"job {job_id} is {job.status}: it can no longer be changed")
    session.commit()
    return Changed(_outs(session, [job], viewer=principal)[0], after)


def update_selected(
    *,
    session: Session,
    principal: Principal,
    selection: JobSelection,
    changes: JobUpdate,
    limits: RuntimeLimits,
) -> Changed[BulkOut]:
    """Change every pending job the selection names, in one transaction, as `scontrol
    update` of an array id changes all its pending tasks. All or nothing: a change refused
    for one job changes none, and the error names that job. Returns how many and which."""
    where = (Job.status == JobStatus.PENDING,)
    ids = _lock_selected(
        session, principal=principal, selection=selection, verb="change", where=where
    )
    for jobs in _in_chunks(session, ids):
        for job in jobs:
            try:
                _update_locked(
                    session, principal=principal, job=job, changes=changes, limits=limits
                )
            except FieldError as exc:
                raise FieldError(
                    exc.field, f"job {job.id}: {exc.message}", location=exc.location
                ) from None
    session.commit()
    return Changed(BulkOut.of(ids), AfterCommit(cycle=bool(ids)))


def _update_locked(
    session: Session, *, principal: Principal, job: Job, changes: JobUpdate, limits: RuntimeLimits
) -> None:
    """Apply `changes` to a pending job whose row the caller holds locked, checked as a
    submission is; notes what changed in its history. Does not commit."""
    sent = changes.model_dump(exclude_unset=True)
    if "notify_on" in sent and "notify_url" not in sent and job.notify_url is None:
        # As at submission: notifications asked for without a URL go to its owner's default.
        owner_default = session.scalar(select(User.notify_url).where(User.id == job.user_id))
        sent["notify_url"] = _default_notify_url(owner_default, whose="its owner's")
    current = {name: getattr(job, name) for name in _REQUEST_FIELDS}
    spec = _changed_spec(session, job=job, current=current, sent=sent, limits=limits)
    if spec.priority != job.priority:
        _check_priority(
            session,
            principal=principal,
            project_id=job.project_id,
            asked=spec.priority,
            current=job.priority,
        )
    check_can_ever_fit(session=session, spec=spec)
    if job.schedule_mode == "offpeak":
        _refuse_if_never_in_window(
            session, spec=spec, window=job.window, preemptible=job.preemptible
        )
    rewired = None
    if "depends_on" in sent or "dependency" in sent:  # checked (and may refuse) first
        rewired = _rewire_dependencies(session=session, principal=principal, job=job, spec=spec)
    changed = {f: getattr(spec, f) for f in current if getattr(spec, f) != current[f]}
    for name, value in changed.items():
        setattr(job, name, value)
    what = [f"{f} {current[f]} -> {v}" for f, v in changed.items()] + ([rewired] if rewired else [])
    if what:
        job.updated_at = utcnow()
        _back_in_line(job, why="changed")
        reason = f"updated by {principal.name}: {', '.join(what)}"
        note(session, job=job, actor=principal.name, reason=reason)


def _changed_spec(
    session: Session,
    *,
    job: Job,
    current: dict[str, Any],
    sent: dict[str, Any],
    limits: RuntimeLimits,
) -> JobCreate:
    """The job's request with `sent` merged in, checked as a submission is: ranges, then
    the cluster's and its project's limits (a time limit left out gets the default). What
    the change leaves as it was is not judged again by limits lowered since."""
    share = None if job.gpu_share_milli == 1000 else job.gpu_share_milli / 1000
    try:
        spec = JobCreate.model_validate(
            {"command": job.command, "gpu_share": share, "gpu_model": job.gpu_model}
            | {"depends_on": job.depends_on, "dependency": job.dependency_kind}
            | current
            | sent
        )
    except ValidationError as exc:
        # The merged request is what is checked; its error names the field sent.
        error = exc.errors()[0]
        where = tuple(str(part) for part in error["loc"]) or (next(iter(sent)),)
        raise FieldError(where, error["msg"].removeprefix("Value error, ")) from None
    project_name, max_s = session.execute(
        select(Project.name, Project.max_runtime_s).where(Project.id == job.project_id)
    ).one()
    project_limit = None if max_s is None else ProjectTimeLimit(project_name, max_s)
    kept = [name for name, value in current.items() if getattr(spec, name) == value]
    return limits.apply(spec, project=project_limit, kept=kept)


def _change_placed_limit(
    session: Session, *, principal: Principal, job: Job, changes: JobUpdate, limits: RuntimeLimits
) -> None:
    """`scontrol update TimeLimit=` on a placed job: its owner may shorten the limit, only
    an admin extend it (as Slurm). Checked as a submission is, and never below the time
    it has run. Its agents are told after the commit (time_limit_orders)."""
    sent = changes.model_dump(exclude_unset=True)
    if set(sent) != {"max_runtime_s"}:
        raise Conflict(
            f"job {job.id} is {job.status}: only its time limit (max_runtime_s) can be "
            "changed once it is placed"
        )
    current = {name: getattr(job, name) for name in _REQUEST_FIELDS}
    old = job.max_runtime_s
    new = _changed_spec(session, job=job, current=current, sent=sent, limits=limits).max_runtime_s
    extends = old is not None and (new is None or new > old)
    if extends and not principal.is_admin:
        raise Forbidden(
            f"job {job.id} is {job.status}: only an admin extends its time limit "
            "(you may shorten it)"
        )
    ran_s = 0 if job.started_at is None else (utcnow() - job.started_at).total_seconds()
    if new is not None and new <= ran_s:
        raise FieldError(
            "max_runtime_s",
            f"job {job.id} has run for {int(ran_s)}s: a time limit of {new}s would end it "
            "at once (cancel it instead)",
        )
    if new != old:
        job.max_runtime_s = new
        job.updated_at = utcnow()
        reason = f"updated by {principal.name}: max_runtime_s {old} -> {new}"
        note(session, job=job, actor=principal.name, reason=reason)


# What PATCH changes by copying a field onto the column of its name; the dependency
# fields are checked and set by _rewire_dependencies.
_REQUEST_FIELDS = tuple(f for f in JobUpdate.model_fields if f not in ("depends_on", "dependency"))


def _rewire_dependencies(
    *, session: Session, principal: Principal, job: Job, spec: JobCreate
) -> str | None:
    """Make a pending job wait for other jobs, or none, as `scontrol update Dependency=`:
    checked as at submission, and refused where it would close a loop (two jobs waiting
    for each other forever). Sets its wait and returns what changed, or None."""
    if spec.dependency == SINGLETON and job.array_id is not None:
        raise FieldError("dependency", "singleton does not apply to a task of an array")
    _check_singleton(spec)
    ids = _with_array_tasks(session=session, ids=spec.depends_on)
    before = _dependency_text(job.depends_on, job.dependency_kind)
    after = _dependency_text(ids, spec.dependency)
    if after == before:
        return None
    if job.id in ids:
        raise FieldError("depends_on", f"job {job.id} cannot wait for itself")
    waiting = _waiting_for(session=session, ids=ids, job_id=job.id)
    if waiting is not None:
        raise FieldError(
            "depends_on",
            f"job {waiting} waits for job {job.id}: they would wait for each other forever",
        )
    if spec.dependency == SINGLETON:
        name = spec.name or job.name
        namesakes = load_namesakes(session, users=[job.user_id], names=[name])
        waits_for = singleton_wait(job.id, name, namesakes.get((job.user_id, name), []))
    else:
        waits_for = _dependencies_left(
            session=session, principal=principal, ids=ids, kind=spec.dependency
        )
    job.depends_on, job.dependency_kind = ids, spec.dependency
    job.dependencies_met = waits_for is None
    if waits_for is not None:
        job.pending_reason, job.pending_message = DEPENDENCY, waits_for
    return f"dependency {before} -> {after}"


def _dependency_text(ids: Sequence[int], kind: str) -> str:
    """As sbatch writes it: afterok:12:13, singleton, or none."""
    if kind == SINGLETON:
        return SINGLETON
    return ":".join([kind, *map(str, ids)]) if ids else "none"


def _waiting_for(*, session: Session, ids: list[int], job_id: int) -> int | None:
    """The first of `ids` that waits for job `job_id`, directly or through other waiting
    jobs; None if none does. Only pending jobs whose dependencies are not met wait."""
    root = {i: i for i in ids}  # a job reached -> which of `ids` it was reached from
    frontier, seen = list(ids), set(ids)
    while frontier:
        rows = session.execute(
            select(Job.id, Job.depends_on).where(
                Job.id.in_(frontier),
                Job.status == JobStatus.PENDING,
                Job.dependencies_met.is_(False),
            )
        ).all()
        frontier = []
        for waiting, depends_on in rows:
            for other in depends_on:
                if other == job_id:
                    return root[waiting]
                if other not in seen:
                    seen.add(other)
                    root[other] = root[waiting]
                    frontier.append(other)
    return None


def change_array_limit(
    *, session: Session, principal: Principal, job_id: int, max_running: int | None
) -> Changed[JobOut]:
    """Let an array run more (or fewer) tasks at once, whatever state its tasks are in:
    `job_id` is any of them. Tasks held back by the old limit are let back in line, and
    the next cycle admits as many as the new one allows; running tasks are not stopped."""
    job = _visible_job(session=session, principal=principal, job_id=job_id)
    if job.array_id is None:
        raise Conflict(f"job {job_id} is not a task of a job array")
    tasks = session.scalars(
        select(Job).where(Job.array_id == job.array_id).order_by(Job.id).with_for_update()
    ).all()
    old = tasks[0].array_max_running
    if old != max_running:
        for task in tasks:
            task.array_max_running = max_running
            if task.status is JobStatus.PENDING and task.pending_reason == ARRAY_LIMIT:
                _back_in_line(task, why="its array's limit changed")
        limits = " -> ".join("none" if n is None else str(n) for n in (old, max_running))
        note(
            session,
            job=tasks[0],
            actor=principal.name,
            reason=f"array limit changed by {principal.name}: {limits} at once",
        )
    session.commit()
    return Changed(_outs(session, [job], viewer=principal)[0], AfterCommit(cycle=True))


def _back_in_line(job: Job, *, why: str) -> None:
    """Ranked anew, as a new arrival (the next quick cycle looks for NEW); a job still
    waiting on its dependencies keeps that reason, which stays true."""
    if job.dependencies_met:
        job.pending_reason = NEW_IN_QUEUE
        job.pending_message = f"{why}; waiting for the next scheduling cycle"
    job.queue_position = job.estimated_start_at = None


def _outs(session: Session, jobs: Sequence[Job], *, viewer: Principal) -> list[JobOut]:
    """The jobs as `viewer` may read them (see _to_out)."""
    if not jobs:
        return []
    user_names = dict(
        session.execute(
            select(User.id, User.name).where(User.id.in_({j.user_id for j in jobs}))
        ).all()
    )
    project_names = dict(
        session.execute(
            select(Project.id, Project.name).where(Project.id.in_({j.project_id for j in jobs}))
        ).all()
    )
    active_ids = [j.id for j in jobs if j.status in ACTIVE]
    allocations: dict[int, list[AllocationOut]] = {}
    last: dict[int, list[AllocationOut]] = {}
    if active_ids:
        for job_id, _, allocation in _allocation_rows(
            session, active_ids, Allocation.released_at.is_(None)
        ):
            allocations.setdefault(job_id, []).append(allocation)
    # Where the others ran last: their current attempt's allocations, released.
    attempts = {j.id: j.attempt for j in jobs if j.status not in ACTIVE and j.attempt}
    if attempts:
        for job_id, attempt, allocation in _allocation_rows(
            session, list(attempts), Allocation.released_at.is_not(None)
        ):
            if attempt == attempts[job_id]:
                last.setdefault(job_id, []).append(allocation)
    return [
        _to_out(
            j,
            user=user_names[j.user_id],
            project=project_names[j.project_id],
            allocations=allocations.get(j.id, []),
            last_allocations=last.get(j.id, []),
            env_readable=viewer.is_admin or j.user_id == viewer.user_id,
        )
        for j in jobs
    ]


def _allocation_rows(
    session: Session, job_ids: list[int], released: ColumnElement[bool]
) -> Iterator[tuple[int, int, AllocationOut]]:
    rows = session.execute(
        select(
            Allocation.job_id,
            Allocation.attempt,
            Node.name,
            Gpu.index,
            Allocation.share_milli,
            Allocation.rank,
        )
        .join(Node, Node.id == Allocation.node_id)
        .outerjoin(Gpu, Gpu.id == Allocation.gpu_id)
        .where(Allocation.job_id.in_(job_ids), released)
        .order_by(Allocation.rank, Gpu.index)
    )
    for job_id, attempt, node, index, share, rank in rows:
        yield (
            job_id,
            attempt,
            AllocationOut(node=node, gpu_index=index, share=share / 1000, rank=rank),
        )


def _to_out(
    job: Job,
    *,
    user: str,
    project: str,
    allocations: list[AllocationOut],
    last_allocations: list[AllocationOut] | None = None,
    env_readable: bool = True,
) -> JobOut:
    """`env_readable`: the viewer may read the job's environment's values (its owner, an
    admin); `--export ALL` copies the submitter's, cloud keys and all, so the other members
    of its project see the variables' names only."""
    # Only a waiting job has a reason to wait: a job cancelled while pending (or in the
    # moment a cycle still ranked it) must not say "waiting for 4 GPUs". A held job's
    # stored reason is the last cycle's (or one a cycle wrote as it was held): not shown.
    waiting = job.status == JobStatus.PENDING
    held = waiting and job.held_by is not None
    reason, message, position, start, note = None, None, None, None, None
    if held:
        reason = HELD
        message = f"held by {job.held_by}: gpusched release {job.id} lets it be scheduled"
        note = "no estimate: held jobs are not in line"
    elif waiting:
        reason, message = job.pending_reason, job.pending_message
        position, start = job.queue_position, job.estimated_start_at
        note = estimate_note(reason=reason, message=message, position=position, start=start)
    return JobOut(
        id=job.id,
        name=job.name,
        user=user,
        project=project,
        status=job.status,
        command=job.command,
        script_bytes=None if job.script is None else len(job.script.encode()),
        workdir=job.workdir,
        env=job.env if env_readable else dict.fromkeys(job.env),
        gpus=job.gpus,
        gpu_memory_mb=job.gpu_memory_mb,
        gpu_share=None if job.gpu_share_milli == 1000 else job.gpu_share_milli / 1000,
        gpu_model=job.gpu_model,
        nodes=job.nodes,
        priority=job.priority,
        max_runtime_s=job.max_runtime_s,
        estimated_runtime_s=job.estimated_runtime_s,
        grace_s=job.grace_s,
        retries=job.retries,
        failures=job.failures,
        preemptible=job.preemptible,
        schedule=ScheduleSpec.model_construct(
            mode=job.schedule_mode,  # type: ignore[arg-type]  # validated at submission
            at=job.begin_at,
            window=job.window,
        ),
        labels=job.labels,
        attempt=job.attempt,
        pending_reason=reason,
        pending_message=message,
        queue_position=position,
        estimated_start_at=start,
        estimate_note=note,
        # A running job has a holder only when requeued with hold: it comes back held.
        held_by=job.held_by if held or job.status in ACTIVE else None,
        only_nodes=job.only_nodes,
        exclude_nodes=job.exclude_nodes or [],
        notify_url=job.notify_url,
        notify_on=job.notify_on or [],
        depends_on=job.depends_on,
        dependency=job.dependency_kind,
        array=None
        if job.array_id is None
        else ArrayOut(
            id=job.array_id,
            index=job.array_index or 0,
            tasks=job.array_size or 1,
            max_running=job.array_max_running,
        ),
        exit_code=job.exit_code,
        cancel_requested=job.cancel_requested_at is not None,
        requeue_requested=job.preempt_requested_at is not None,
        allocations=allocations,
        last_allocations=last_allocations or [],
        created_at=job.created_at,
        scheduled_at=job.scheduled_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
    )
