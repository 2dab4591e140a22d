"""Domain errors with the HTTP status they map to; routers stay free of status logic."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ErrorOut(BaseModel):
    detail: str


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorOut, "description": description}


# Documented on every /api/v1 route, so clients (and the schema fuzzer) know every status
# the API can answer with.
API_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _error("The body could not be parsed"),
    401: _error("Missing, invalid, expired or revoked token"),
    403: _error("Not allowed: admin role or project membership required"),
    404: _error("No such resource"),
    409: _error("Conflicts with the current state (e.g. an Idempotency-Key reused)"),
    413: {"content": {"text/plain": {}}, "description": "Body larger than the size limit"},
    429: _error("Too many failed token checks, or a limit of pending jobs reached"),
    503: _error("Database unavailable; retry later"),
}


class DomainError(Exception):
    status_code = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(DomainError):
    status_code = 404


class Forbidden(DomainError):
    status_code = 403


class Conflict(DomainError):
    status_code = 409


class TooMany(DomainError):
    """A limit on how much one user or project may have (pending jobs): 429, as Kubernetes
    answers a ResourceQuota on object counts with 403 and Slurm refuses at submit."""

    status_code = 429


class FieldError(DomainError):
    """Bad input that passed schema validation: rendered like FastAPI's own 422s, with
    `location` "body" or "query" as the first element of `loc`."""

    status_code = 422

    def __init__(
        self, field: str | tuple[str, ...], message: str, *, location: str = "body"
    ) -> None:
        super().__init__(message)
        self.field = field  # a name, or a path into a nested body: ("schedule", "window")
        self.location = location

    @property
    def path(self) -> tuple[str, ...]:
        return (self.field,) if isinstance(self.field, str) else self.field
