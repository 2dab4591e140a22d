"""Base of every request body. Refused, each with the field named: unknown fields, true or
false where a number belongs, and NUL bytes in any string (no database text column,
environment variable or argv entry can carry one)."""

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


def _has_nul(value: object) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    return False


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

    @field_validator("*")
    @classmethod
    def _no_nul_bytes(cls, value: Any) -> Any:
        # After validation, a nested body is a model (checked by its own validator, which
        # names the inner field); strings, lists and dicts are looked into here.
        if _has_nul(value):
            raise ValueError("must not contain NUL bytes")
        return value
