"""Filter result: separates "fits", "does not fit now" and "can never fit".

Modelled on the Kubernetes scheduler framework's Status: a job that can never
fit (wants 9 GPUs per node when the largest node has 8) must be told so
instead of waiting forever behind a generic "waiting for GPUs".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from app.scheduling.types import PolicySettings, ReasonKind, WindowInterval


class Code(enum.Enum):
    SUCCESS = "success"
    UNSCHEDULABLE = "unschedulable"  # does not fit now, may later
    UNRESOLVABLE = "unresolvable"  # can never fit on this cluster as configured


@dataclass(frozen=True, slots=True)
class Status:
    code: Code
    kind: ReasonKind | None = None
    message: str = ""
    estimated_start: datetime | None = None

    @property
    def ok(self) -> bool:
        return self.code is Code.SUCCESS


OK = Status(Code.SUCCESS)


def unschedulable(
    kind: ReasonKind, message: str, estimated_start: datetime | None = None
) -> Status:
    return Status(Code.UNSCHEDULABLE, kind, message, estimated_start)


def unresolvable(kind: ReasonKind, message: str) -> Status:
    return Status(Code.UNRESOLVABLE, kind, message)


@dataclass(frozen=True, slots=True)
class Context:
    """What every filter may look at besides its subject: the time and the policy."""

    now: datetime
    settings: PolicySettings
    windows: tuple[WindowInterval, ...] = ()
