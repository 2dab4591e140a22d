from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, computed_field


class AuditEventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    at: datetime
    actor: str
    action: str
    target: str
    # What changed: {"field": {"from": old, "to": new}} for updates, the settings otherwise.
    info: dict[str, Any]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def summary(self) -> str:
        """`info` in one line; the CLI and the dashboard show it as is."""
        return describe(self.info)


class AuditPage(BaseModel):
    items: list[AuditEventOut]
    # Pass as `before` for the next (older) page; null on the last page.
    next_before: int | None


def describe(info: dict[str, Any]) -> str:
    """One line for people (CLI and dashboard show it as is): "gpu_quota 0 -> 4" for a
    change, "projects=ml,cv" for a setting, nested ones in parentheses, unset ones left out."""
    parts = []
    for key, value in info.items():
        if isinstance(value, dict) and value.keys() == {"from", "to"}:
            parts.append(f"{key} {_plain(value['from'])} -> {_plain(value['to'])}")
        elif value is not None:
            parts.append(f"{key}={_plain(value)}")
    return ", ".join(parts)


def _plain(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(_plain(v) for v in value) or "-"
    if isinstance(value, dict):
        return "(" + " ".join(f"{k}={_plain(v)}" for k, v in value.items() if v is not None) + ")"
    return "-" if value is None else str(value)
