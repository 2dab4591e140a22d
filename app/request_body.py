"""Base of every request body: unknown fields and true/false where a number belongs are errors."""

from __future__ import annotations

from types import UnionType
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def _numeric(annotation: Any) -> bool:
    """True for int, float and their optional forms; False when bool is also allowed."""
    kinds = (
        set(get_args(annotation)) if get_origin(annotation) in (Union, UnionType) else {annotation}
    )
    return bool(kinds & {int, float}) and bool not in kinds


class RequestBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # Pydantic's lax mode reads true as 1: `"gpus": true` would quietly ask for one GPU.
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and _numeric(field.annotation):
            raise ValueError("must be a number, not true or false")
        return value
