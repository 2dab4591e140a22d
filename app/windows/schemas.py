"""REST bodies for off-peak windows (pydantic v2).

Validation errors name the offending field in ``loc``:

* unknown zone -> ``("timezone",)``; invalid cron -> ``("cron",)``;
  ``duration_s`` <= 0, missing for a cron window or given for a daily one ->
  ``("duration_s",)``;
* both ``cron`` and ``daily``, or neither -> ``("daily",)``;
* a daily range with ``end == start`` -> ``("daily", i, "end")``; bad ``HH:MM``
  -> ``("daily", i, "start"|"end")``; unknown day -> ``("daily", i, "days", j)``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)

from app.request_body import RequestBody
from app.windows.calendar import (
    SLUG_RE,
    DailyRange,
    UpcomingWindow,
    Weekday,
    WindowSpec,
    parse_hhmm,
    validate_cron,
    validate_timezone,
)

__all__ = ["DailyRangeIn", "UpcomingWindow", "WindowIn", "WindowOut"]

HHMM = Annotated[str, Field(examples=["01:00"], description="local wall time HH:MM")]


class DailyRangeIn(RequestBody):
    """``{"start": "HH:MM", "end": "HH:MM", "days": ["mon", ...]}``.

    ``end`` before ``start`` crosses midnight; ``days`` name the opening weekday.
    """

    start: HHMM
    end: HHMM
    days: list[Weekday] | None = Field(
        default=None, description="weekday the range opens on; omitted = every day"
    )

    @field_validator("start")
    @classmethod
    def _check_start(cls, v: str) -> str:
        parse_hhmm(v)
        return v

    @field_validator("end")
    @classmethod
    def _check_end(cls, v: str, info: ValidationInfo) -> str:
        end = parse_hhmm(v)
        start = info.data.get("start")
        if start is not None and parse_hhmm(start) == end:
            raise ValueError("end must differ from start (end before start crosses midnight)")
        return v

    @field_validator("days")
    @classmethod
    def _check_days(cls, v: list[Weekday] | None) -> list[Weekday] | None:
        if v is not None and not v:
            raise ValueError("days must not be empty (omit it for every day)")
        return v

    def to_range(self) -> DailyRange:
        return DailyRange(
            start=parse_hhmm(self.start),
            end=parse_hhmm(self.end),
            days=frozenset(self.days) if self.days else frozenset(_ALL),
        )


_ALL: tuple[Weekday, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


class WindowIn(RequestBody):
    """Body of ``POST/PUT /windows``: exactly one of ``cron`` (+ ``duration_s``) or ``daily``."""

    name: str = Field(pattern=SLUG_RE.pattern, description="slug: a-z, 0-9, '-', '_'")
    timezone: str = Field(description="IANA zone name, e.g. Europe/Berlin")
    cron: str | None = Field(default=None, description="5-field cron of local start times")
    duration_s: int | None = Field(
        default=None, gt=0, validate_default=True, description="cron windows: real seconds"
    )
    daily: list[DailyRangeIn] | None = Field(
        default=None,
        validate_default=True,
        description="daily windows as local start and end times (instead of cron)",
    )
    capacity_outside_fraction: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="fraction of all GPUs that preemptible off-peak jobs may use while the "
        "window is closed (0: they wait for the window; 1: no limit)",
    )
    preempt_on_close: bool = Field(
        default=True, description="stop preemptible off-peak jobs when the window closes"
    )

    @field_validator("timezone")
    @classmethod
    def _check_timezone(cls, v: str) -> str:
        validate_timezone(v)
        return v

    @field_validator("cron")
    @classmethod
    def _check_cron(cls, v: str | None) -> str | None:
        return None if v is None else validate_cron(v)

    # Field validators (not a model validator) so that errors carry the field's loc.
    # Fields validate in declaration order: cron is in info.data by now unless it
    # failed its own validation (then it is absent and we stay quiet).
    @field_validator("duration_s")
    @classmethod
    def _check_duration(cls, v: int | None, info: ValidationInfo) -> int | None:
        if "cron" not in info.data:
            return v
        cron = info.data["cron"]
        if cron is not None and v is None:
            raise ValueError("duration_s is required with cron")
        if cron is None and v is not None:
            raise ValueError("duration_s only applies to cron windows")
        return v

    @field_validator("daily")
    @classmethod
    def _check_daily(
        cls, v: list[DailyRangeIn] | None, info: ValidationInfo
    ) -> list[DailyRangeIn] | None:
        if v is not None and not v:
            raise ValueError("daily must list at least one range")
        if "cron" not in info.data:
            return v
        cron = info.data["cron"]
        if cron is not None and v is not None:
            raise ValueError("give either cron or daily, not both")
        if cron is None and v is None:
            raise ValueError("give either cron (with duration_s) or daily")
        return v

    def to_spec(self) -> WindowSpec:
        return WindowSpec(
            name=self.name,
            timezone=self.timezone,
            cron=self.cron,
            duration_s=self.duration_s,
            daily=tuple(r.to_range() for r in self.daily or ()),
            capacity_outside_fraction=self.capacity_outside_fraction,
            preempt_on_close=self.preempt_on_close,
        )


class WindowOut(WindowIn):
    """A stored window: the body fields plus its ``id``."""

    model_config = ConfigDict(extra="forbid", from_attributes=True)

    id: int

    @classmethod
    def from_spec(cls, spec: WindowSpec, *, id: int) -> WindowOut:
        daily = None
        if spec.daily:
            daily = [
                DailyRangeIn(
                    start=r.start.strftime("%H:%M"),
                    end=r.end.strftime("%H:%M"),
                    days=None if r.days == frozenset(_ALL) else [d for d in _ALL if d in r.days],
                )
                for r in spec.daily
            ]
        return cls(
            id=id,
            name=spec.name,
            timezone=spec.timezone,
            cron=spec.cron,
            duration_s=spec.duration_s,
            daily=daily,
            capacity_outside_fraction=spec.capacity_outside_fraction,
            preempt_on_close=spec.preempt_on_close,
        )
