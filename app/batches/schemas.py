"""REST bodies for cron batches (pydantic v2).

Validation errors name the field in ``loc``: ``("cron",)``, ``("timezone",)``,
``("window",)``, ``("templates", i, "gpus")`` and so on. Template checks that need the
database (project membership, "can any node ever fit this") are raised by the service with
the same kind of location.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_serializer, field_validator

from app.jobs.schemas import JobCreate, ScheduleSpec
from app.request_body import RequestBody
from app.windows.calendar import SLUG_RE, validate_cron, validate_timezone

Target = Literal["now", "offpeak"]
CatchUp = Literal["once", "skip"]
Concurrency = Literal["allow", "forbid", "replace"]

MAX_TEMPLATES = 100


class JobTemplate(JobCreate):
    """One job of a batch: a job submission body without ``schedule`` (the batch's
    ``target`` and ``window`` decide when its jobs may start)."""

    @field_validator("schedule")
    @classmethod
    def _no_schedule(cls, value: ScheduleSpec) -> ScheduleSpec:
        raise ValueError(
            "not allowed in a batch template: set the batch's target (now/offpeak) and window"
        )

    @field_validator("hold")
    @classmethod
    def _no_hold(cls, value: bool) -> bool:
        if value:
            raise ValueError(
                "not allowed in a batch template: disable the batch instead (batch disable)"
            )
        return value

    after: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list,
        max_length=MAX_TEMPLATES,
        description="earlier templates of this batch (0-based) whose jobs, of the same "
        "firing, must succeed first: a nightly prepare -> train -> eval pipeline",
    )

    @field_validator("depends_on")
    @classmethod
    def _no_dependencies(cls, value: list[int]) -> list[int]:
        if value:
            raise ValueError(
                "not allowed in a batch template: each firing makes new jobs; "
                "use 'after' to wait for an earlier template's job"
            )
        return value

    @field_validator("after")
    @classmethod
    def _unique_templates(cls, value: list[int]) -> list[int]:
        return list(dict.fromkeys(value))


class BatchIn(RequestBody):
    """Body of ``POST /batches`` and ``PUT /batches/{name}``."""

    name: str = Field(pattern=SLUG_RE.pattern, description="slug: a-z, 0-9, '-', '_'")
    cron: str = Field(description="5-field cron of local fire times, e.g. '0 2 * * *'")
    timezone: str = Field(default="UTC", description="IANA zone of the cron, e.g. Europe/Berlin")
    templates: list[JobTemplate] = Field(
        min_length=1,
        max_length=MAX_TEMPLATES,
        description="the jobs each firing submits: job submissions without schedule or hold",
    )
    target: Target = Field(
        default="now", description="now: run as soon as possible; offpeak: wait for a window"
    )
    window: str | None = Field(
        default=None, min_length=1, max_length=64, description="off-peak window (with offpeak)"
    )
    enabled: bool = Field(default=True, description="false: it does not fire until enabled")
    catch_up: CatchUp = Field(
        default="once",
        description="after downtime: once = run the latest missed fire time once; "
        "skip = record a late fire time as skipped",
    )
    concurrency: Concurrency = Field(
        default="allow",
        description="when a fire time comes while jobs of an earlier firing have not ended "
        "(as a Kubernetes CronJob's concurrencyPolicy): allow = submit anyway, they overlap; "
        "forbid = record the fire time as skipped, saying which jobs; replace = cancel them "
        "(running ones get their grace period), then submit",
    )

    @field_validator("cron")
    @classmethod
    def _check_cron(cls, value: str) -> str:
        return validate_cron(value)

    @field_validator("timezone")
    @classmethod
    def _check_timezone(cls, value: str) -> str:
        validate_timezone(value)
        return value

    @field_validator("window")
    @classmethod
    def _window_needs_offpeak(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("target", "now") != "offpeak":
            raise ValueError("window is only allowed with target 'offpeak'")
        return value


class _Times(BaseModel):
    @field_serializer("*", when_used="json")
    def _iso(self, value: Any) -> Any:
        # datetime.isoformat keeps the zone's offset ("+00:00" too; pydantic writes "Z").
        return value.isoformat() if isinstance(value, datetime) else value


class BatchOut(_Times):
    """A stored schedule. Times carry the offset of the schedule's zone."""

    id: int
    name: str
    owner: str
    project: str
    cron: str
    timezone: str
    templates: list[dict[str, Any]]
    target: Target
    window: str | None
    enabled: bool
    catch_up: CatchUp
    concurrency: Concurrency
    created_at: datetime
    updated_at: datetime
    next_fire_at: datetime | None = Field(description="null when disabled")
    last_fired_at: datetime | None = Field(
        description="latest fire time of its schedule that submitted jobs (runs by hand are "
        "in the firing history)"
    )


class FiringOut(_Times):
    """One fire time of a schedule: the jobs it submitted, or why it submitted none."""

    fire_at: datetime
    created_at: datetime
    skipped: bool
    job_ids: list[int] = Field(
        description="one per template, in order; an array template's is its array id "
        "(`GET /jobs?array=ID` lists its tasks)"
    )
    error: str | None
    run_by: str | None = Field(
        default=None,
        description="who ran the batch by hand (`batch run`); null: its schedule fired it",
    )
