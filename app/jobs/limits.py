"""The cluster's time limits for jobs, as Slurm's DefaultTime and MaxTime on a partition,
a project's own longest limit (as a QOS's MaxWall), and the longest stop grace period a
job may ask for.

A job that gives no `max_runtime_s` gets the default. With every job's end known, backfill
can plan around running jobs and waiting jobs get an estimated start; a job with no limit
counts as never ending, so GPUs are held idle for the head of the queue instead.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from app.config import Settings
from app.errors import FieldError, Forbidden
from app.jobs.schemas import JobCreate
from app.notifications.hosts import check_url
from app.text import readable_span


@dataclass(frozen=True, slots=True)
class RuntimeLimits:
    default_s: int | None = None  # for jobs that set none; unset: max_s, else no limit
    max_s: int | None = None  # the longest limit a job may ask for
    # A long grace delays whoever waits for the job's GPUs (a preemptor, the off-peak
    # closing), so the cluster bounds it, as Slurm bounds KillWait.
    max_grace_s: int = 600
    # Hosts a job's notify_url may name (GPUSCHED_NOTIFY_HOSTS; "*": any; none: off).
    notify_hosts: frozenset[str] = frozenset()
    # Jobs a user may have pending unless the user has a limit of their own (app/jobs/
    # pending_limits.py): one user cannot bury the others' jobs under a deep queue.
    max_pending_per_user: int = 10_000

    def apply(
        self,
        spec: JobCreate,
        *,
        project: ProjectTimeLimit | None = None,
        kept: Collection[str] = (),
    ) -> JobCreate:
        """`spec` with its time limit filled in; a 422 on the field that breaks a limit.
        A job that gives none gets the default, cut to its project's longest limit.

        `kept`: fields a change of a job leaves as they were when it was admitted. They are
        not judged again by limits an admin may have lowered since (a host removed from
        the notification hosts, a shorter project limit): as in Slurm, a job keeps what it
        was admitted with, and changing its priority must not fail on its time limit."""
        if spec.notify_url is not None and "notify_url" not in kept:
            refused = check_url(spec.notify_url, self.notify_hosts)
            if refused is not None:
                raise FieldError("notify_url", refused)
        if spec.grace_s is not None and spec.grace_s > self.max_grace_s and "grace_s" not in kept:
            raise FieldError(
                "grace_s",
                f"{readable_span(spec.grace_s)} is above this cluster's longest grace period, "
                f"{readable_span(self.max_grace_s)}",
            )
        if "max_runtime_s" in kept:
            limit, given = spec.max_runtime_s, "its max_runtime_s"
        else:
            limit, given = self._time_limit(spec.max_runtime_s, project)
        estimate = spec.estimated_runtime_s
        if estimate is not None and limit is not None and estimate > limit:
            longest = min(
                (m for m in (self.max_s, project.max_s if project else None) if m is not None),
                default=None,
            )
            room = (
                f" up to {readable_span(longest)}"
                if longest is not None and longest > limit
                else ""
            )
            raise FieldError(
                "estimated_runtime_s",
                f"{readable_span(estimate)} is longer than the job's time limit, {readable_span(limit)}"
                f" ({given}): it would be stopped first; set max_runtime_s{room}",
            )
        if limit == spec.max_runtime_s:
            return spec
        return spec.model_copy(update={"max_runtime_s": limit})

    def _time_limit(
        self, asked: int | None, project: ProjectTimeLimit | None
    ) -> tuple[int | None, str]:
        """The limit a job asking for `asked` gets, and where it comes from; a 422 when it
        asks for more than the cluster's or its project's longest."""
        if asked is not None and self.max_s is not None and asked > self.max_s:
            raise FieldError(
                "max_runtime_s",
                f"{readable_span(asked)} is above this cluster's longest time limit, {readable_span(self.max_s)}",
            )
        if asked is not None and project is not None and asked > project.max_s:
            raise FieldError(
                "max_runtime_s",
                f"{readable_span(asked)} is above the longest time limit of project {project.name}, "
                f"{readable_span(project.max_s)}",
            )
        limit = asked if asked is not None else self.default_s or self.max_s
        given = "its max_runtime_s" if asked is not None else "the cluster's default"
        if project is not None and (limit is None or limit > project.max_s):
            limit, given = project.max_s, f"the longest of project {project.name}"
        return limit, given


@dataclass(frozen=True, slots=True)
class ProjectTimeLimit:
    """A project's longest time limit (Project.max_runtime_s), as a Slurm QOS's MaxWall."""

    name: str
    max_s: int


def check_priority(
    *, asked: int, project: str, project_max: int, current: int | None = None
) -> None:
    """Priority is granted, not taken: a user may lower a job's priority, as Slurm's nice,
    and give it at most its project's maximum (an admin sets it; 0 by default) or keep
    what it has (an admin may have raised it). Only admins, whom the caller does not ask
    here, give more. A 403 says who can."""
    kept = 0 if current is None else current
    highest = max(project_max, kept)
    if asked <= highest:
        return
    given = (
        f"{highest}, what the job has"
        if kept > project_max
        else f"{project_max}, the maximum of project {project}"
    )
    raise Forbidden(
        f"priority {asked} is above {given}: only an admin gives a job a higher priority, "
        f"or raises the project's maximum for its users (gpusched quota {project} "
        "--max-priority N); you may lower it"
    )


def runtime_limits(settings: Settings) -> RuntimeLimits:
    return RuntimeLimits(
        default_s=settings.default_max_runtime_s,
        max_s=settings.max_runtime_limit_s,
        max_grace_s=settings.max_grace_s,
        notify_hosts=settings.notify_host_set,
        max_pending_per_user=settings.max_pending_jobs_per_user,
    )
