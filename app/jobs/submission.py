"""Submitting jobs: every check a new job passes (the inventory: can it ever fit, on which
nodes; the windows; priority, singleton, dependencies), then its rows (an array's tasks
included), idempotent by request key."""

from __future__ import annotations

import hashlib
import json
import re
from contextlib import suppress
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.db import utcnow
from app.errors import Conflict, FieldError
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
from app.jobs.limits import ProjectTimeLimit, RuntimeLimits, check_priority
from app.jobs.models import Job, JobEvent
from app.jobs.orders import AfterCommit
from app.jobs.pending_limits import PendingCounts, check_pending_limits
from app.jobs.queries import outs, to_out
from app.jobs.schemas import (
    JobCreate,
    JobOut,
)
from app.jobs.states import SINGLETON, JobStatus
from app.nodes.inventory import Inventory, InventoryCache, read_inventory
from app.projects.models import Project
from app.scheduling.types import ReasonKind
from app.text import escape_controls
from app.windows.service import require_long_enough_opening, require_window


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
    url = default_notify_url(principal.notify_url, whose="your")
    return spec.model_copy(update={"notify_url": url})


def default_notify_url(default: str | None, *, whose: str) -> str:
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
    check_priority_grant(session, principal=principal, project_id=project_id, asked=spec.priority)
    check_can_ever_fit(session=session, spec=spec, inventory=inventory)
    if spec.schedule.mode == "offpeak":
        require_window(session=session, name=spec.schedule.window, field=("schedule", "window"))
        refuse_if_never_in_window(
            session, spec=spec, window=spec.schedule.window, preemptible=spec.preemptible
        )
    check_singleton(spec)
    return CheckedSubmission(spec=spec, project_id=project_id, project_name=project_name)


def refuse_if_never_in_window(
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


def check_priority_grant(
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
    pending_counts: PendingCounts | None = None,
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
        depends_on = with_array_tasks(session=session, ids=spec.depends_on)
        waits_for = dependencies_left(
            session=session, principal=principal, ids=depends_on, kind=spec.dependency
        )
    indices: tuple[int | None, ...] = (None,) if spec.array is None else spec.array.task_indices
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
            pending_reason=(ReasonKind.NEW if waits_for is None else ReasonKind.DEPENDENCY).value,
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
    # After the flush: the first id bounds what was submitted since the kept count, which
    # spares most submissions the count (pending_limits). A refusal rolls the jobs back.
    check_pending_limits(
        session=session,
        principal=principal,
        project_id=project_id,
        project_name=project_name,
        first_id=tasks[0].id,
        adding=len(indices),
        user_default=limits.max_pending_per_user,
        counts=pending_counts,
    )
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


def with_array_tasks(*, session: Session, ids: list[int]) -> list[int]:
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


def check_singleton(spec: JobCreate) -> None:
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


def dependencies_left(
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
    pending_counts: PendingCounts | None = None,
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
            pending_counts=pending_counts,
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
        job=to_out(job, user=principal.name, project=project_name, allocations=[]), created=True
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
    return outs(session, [job], viewer=principal)[0]
