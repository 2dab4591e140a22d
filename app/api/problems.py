"""One error shape for every error: RFC 9457 problem details (`application/problem+json`).

Validation errors (FastAPI's 422s, the app's own `FieldError`s), `HTTPException`s (auth,
404 for an unknown path, 405, 413) and the domain errors all leave through the handlers
below, so a client reads `detail` for the message and, on a 422, `errors` for each field
and its reason. The OpenAPI document declares the shape once (`ProblemDetails`) and, per
operation, only the statuses that operation can answer with (`document_errors`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.exc import DataError, OperationalError
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.deps import get_principal, get_session, require_admin
from app.errors import DomainError, FieldError

log = logging.getLogger("gpusched.api")

PROBLEM_JSON = "application/problem+json"


# RFC 9110's names where Python's table (before 3.13) keeps the older ones, so a title does
# not change with the interpreter.
_RFC9110_TITLES = {413: "Content Too Large", 422: "Unprocessable Content"}


def title_of(status: int) -> str:
    return _RFC9110_TITLES.get(status) or HTTPStatus(status).phrase


class FieldProblem(BaseModel):
    """One invalid field of a request and why."""

    loc: list[str | int] = Field(
        description="Where the field is: 'body', 'query', 'path' or 'header', then the "
        "path into it (e.g. ['body', 'env', 'PATH'])"
    )
    field: str = Field(description="The field's name, dotted for nested fields (e.g. 'env.PATH')")
    msg: str = Field(description="Why the value was refused")
    type: str = Field(description="A machine-readable kind of error (e.g. 'missing')")


class ProblemDetails(BaseModel):
    """An error, as RFC 9457 problem details."""

    type: str = Field(
        default="about:blank",
        description="A URI reference naming the kind of problem; 'about:blank' when the "
        "HTTP status says it all",
    )
    title: str = Field(description="A short summary of the kind of problem (the status phrase)")
    status: int = Field(description="The HTTP status code")
    detail: str = Field(description="What went wrong, for a person to read")
    instance: str = Field(description="The path of the request that failed")
    errors: list[FieldProblem] | None = Field(
        default=None, description="For a 422: each invalid field and why"
    )


def _field_name(loc: Sequence[str | int]) -> str:
    path = list(loc[1:]) if loc and loc[0] in ("body", "query", "path", "header") else list(loc)
    return ".".join(str(part) for part in path) or str(loc[0] if loc else "request")


def field_problem(loc: Sequence[str | int], msg: str, kind: str = "value_error") -> FieldProblem:
    return FieldProblem(loc=list(loc), field=_field_name(loc), msg=msg, type=kind)


def problem_response(
    request: Request,
    status: int,
    detail: str,
    *,
    errors: Iterable[FieldProblem] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    problem = ProblemDetails(
        title=title_of(status),
        status=status,
        detail=detail,
        instance=request.url.path,
        errors=list(errors) if errors is not None else None,
    )
    return JSONResponse(
        problem.model_dump(exclude_none=True),
        status_code=status,
        headers=dict(headers) if headers else None,
        media_type=PROBLEM_JSON,
    )


def validation_problem(request: Request, errors: list[FieldProblem]) -> JSONResponse:
    detail = "; ".join(f"{e.field}: {e.msg}" for e in errors) or "invalid request"
    return problem_response(request, 422, detail, errors=errors)


def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    detail = exc.detail if isinstance(exc.detail, str) else title_of(exc.status_code)
    return problem_response(request, exc.status_code, detail, headers=exc.headers)


def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    # Pydantic's "input" echo is left out: it can be megabytes, and it may hold secrets (env).
    errors = [
        field_problem(_where(err), str(err.get("msg", "")), str(err.get("type", "")))
        for err in exc.errors()
    ]
    return validation_problem(request, errors)


def _where(err: Mapping[str, Any]) -> tuple[str | int, ...]:
    loc = tuple(err.get("loc", ()))
    # A body that is not JSON: pydantic puts the character offset where a field belongs.
    return loc[:1] if err.get("type") == "json_invalid" else loc


def _field_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FieldError)
    return validation_problem(request, [field_problem((exc.location, *exc.path), exc.message)])


def _domain_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, DomainError)
    return problem_response(request, exc.status_code, exc.message)


def _database_down(request: Request, exc: Exception) -> JSONResponse:
    # Connection refused, server restarting, SQLite locked: the client should retry.
    log.error("database unavailable: %s", getattr(exc, "orig", exc))
    return problem_response(
        request, 503, "database unavailable, retry later", headers={"Retry-After": "2"}
    )


def _unstorable_value(request: Request, exc: Exception) -> JSONResponse:
    # PostgreSQL refuses some values any Python str can hold (a NUL byte in a name or a
    # query filter): the request is at fault, not the server.
    log.info(
        "refused a value the database cannot store: %s", type(getattr(exc, "orig", exc)).__name__
    )
    message = "a value in the request cannot be stored (e.g. it contains a NUL byte)"
    return validation_problem(request, [field_problem(("request",), message)])


class TooLargeAsProblem:
    """Starlette's body limit answers a too-large body (by its Content-Length, before any
    handler runs) in plain text, from outside every handler and user middleware: this
    rewrites that one answer as problem details."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rewriting = False

        async def rewrite(message: Message) -> None:
            nonlocal rewriting
            if message["type"] == "http.response.start" and message["status"] == 413:
                headers = MutableHeaders(scope=message)
                rewriting = headers.get("content-type", "").startswith("text/plain")
                if rewriting:
                    body = _too_large_body(scope["path"])
                    headers["content-type"] = PROBLEM_JSON
                    headers["content-length"] = str(len(body))
                    await send(message)
                    await send({"type": "http.response.body", "body": body})
                    return
            if rewriting:
                return  # the plain-text body, replaced above
            await send(message)

        await self.app(scope, receive, rewrite)


def _too_large_body(path: str) -> bytes:
    problem = ProblemDetails(
        title=title_of(413),
        status=413,
        detail="the request body is larger than the server accepts (GPUSCHED_MAX_BODY_BYTES)",
        instance=path,
    )
    return problem.model_dump_json(exclude_none=True).encode()


def add_problem_handlers(app: FastAPI) -> None:
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(FieldError, _field_error)
    app.add_exception_handler(DomainError, _domain_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(OperationalError, _database_down)
    app.add_exception_handler(DataError, _unstorable_value)
    # FastAPI puts its body limit outside the user middleware: wrap the whole stack.
    build_stack = app.build_middleware_stack
    setattr(app, "build_middleware_stack", lambda: TooLargeAsProblem(build_stack()))  # noqa: B010


# --- OpenAPI -------------------------------------------------------------------------------

# Why each status can happen; an operation lists the ones that apply to it.
DESCRIPTIONS: dict[int, str] = {
    400: "The body could not be read",
    401: "Missing, invalid, expired or revoked token",
    403: "Not allowed: admin role required",
    404: "No such resource",
    409: "Conflicts with the current state",
    413: "Body larger than the size limit",
    422: "Invalid request: `errors` names each field and why",
    429: "Too many failed token checks from this address or for this token",
    503: "Database unavailable; retry later",
}


NOT_A_MEMBER = "The job belongs to a project you are not a member of"


def problems(*statuses: int, **descriptions: str) -> dict[int | str, dict[str, Any]]:
    """`responses=` for the statuses a route answers beyond those derived from its shape
    (token, admin, path ids, parameters, body, database): a 409 where state conflicts, a
    403 for project membership, a 429 for a quota. `descriptions` (keyed `s409`...)
    replace the generic wording."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        text = descriptions.get(f"s{status}", DESCRIPTIONS.get(status, title_of(status)))
        out[status] = {"model": ProblemDetails, "description": text}
    return out


def _dependency_calls(route: Any) -> set[Callable[..., Any]]:
    calls: set[Callable[..., Any]] = set()
    stack = [route.dependant]
    while stack:
        dependant = stack.pop()
        if dependant.call is not None:
            calls.add(dependant.call)
        stack.extend(dependant.dependencies)
    return calls


def _has_params(route: Any) -> bool:
    dependant = route.dependant
    stack = [dependant]
    while stack:
        d = stack.pop()
        if d.path_params or d.query_params or d.header_params or d.cookie_params:
            return True
        stack.extend(d.dependencies)
    return False


def derived_statuses(route: Any) -> dict[int, str]:
    """The error statuses a route can answer with, read from what it depends on."""
    calls = _dependency_calls(route)
    out: dict[int, str] = {}
    if get_principal in calls:
        out[401] = DESCRIPTIONS[401]
        out[429] = DESCRIPTIONS[429]
    if require_admin in calls:
        out[403] = DESCRIPTIONS[403]
    if "{" in route.path:
        out[404] = "No such resource (an id or name in the path)"
    body = route.body_field is not None
    if body:
        out[400] = DESCRIPTIONS[400]
        out[413] = DESCRIPTIONS[413]
    if body or _has_params(route):
        out[422] = DESCRIPTIONS[422]
    if get_session in calls:
        out[503] = DESCRIPTIONS[503]
    return out


def _flat_routes(app: FastAPI) -> Iterator[Any]:
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # pragma: no cover - FastAPI before nested routers
        yield from app.routes
        return
    yield from iter_route_contexts(app.routes)


def _problem_content(status: int, description: str, path: str) -> dict[str, Any]:
    """The shape, with an example of this status on this operation (Swagger UI shows it)."""
    example: dict[str, Any] = {
        "type": "about:blank",
        "title": title_of(status),
        "status": status,
        "detail": description,
        "instance": path,
    }
    if status == 422:
        msg = "Input should be greater than or equal to 1"
        example["detail"] = f"limit: {msg}"
        example["errors"] = [
            {"loc": ["query", "limit"], "field": "limit", "msg": msg, "type": "greater_than_equal"}
        ]
    schema = {"$ref": "#/components/schemas/ProblemDetails"}
    return {PROBLEM_JSON: {"schema": schema, "example": example}}


def document_errors(app: FastAPI, doc: dict[str, Any]) -> None:
    """Give each operation its own error statuses, all with the ProblemDetails shape."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    shape = ProblemDetails.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(shape.pop("$defs", {}))
    schemas["ProblemDetails"] = shape
    for route in _flat_routes(app):
        if not hasattr(route, "dependant") or not getattr(route, "include_in_schema", True):
            continue
        item = doc["paths"].get(route.path, {})
        derived = derived_statuses(route)
        for method in route.methods or ():
            operation = item.get(method.lower())
            if operation is None:
                continue
            responses = operation.setdefault("responses", {})
            for status, text in derived.items():
                responses.setdefault(str(status), {"description": text})
            if "422" in responses and "422" not in {str(s) for s in derived}:
                # FastAPI's own 422 on a route without parameters or body: cannot happen.
                del responses["422"]
            for status, response in responses.items():
                if status.isdigit() and int(status) >= 400:
                    if int(status) == 422:
                        response["description"] = derived.get(422, DESCRIPTIONS[422])
                    text = response.get("description", title_of(int(status)))
                    response["content"] = _problem_content(int(status), text, route.path)
    # FastAPI's list-shaped validation error is no longer answered by any operation.
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
