"""Lists answer a page at a time: at most `limit` items from `offset`, with the count of
them all in the `X-Total-Count` header, so that no list grows a response without bound
(a job changed ten thousand times has ten thousand events) while its clients keep reading
the plain array they always read. Jobs and the queue page with a body of their own
(JobPage, PendingPage)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Query, Response
from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

T = TypeVar("T")

DEFAULT_LIMIT = 500
MAX_LIMIT = 1000
TOTAL_HEADER = "X-Total-Count"


@dataclass(frozen=True, slots=True)
class Page:
    offset: int = 0
    limit: int = DEFAULT_LIMIT

    def of(self, query: Select[Any]) -> Select[Any]:
        return query.offset(self.offset).limit(self.limit)

    def cut(self, items: list[T]) -> list[T]:
        return items[self.offset : self.offset + self.limit]


def page(
    offset: Annotated[int, Query(ge=0, le=1_000_000, description="skip this many")] = 0,
    limit: Annotated[
        int, Query(ge=1, le=MAX_LIMIT, description="at most this many; X-Total-Count: all")
    ] = DEFAULT_LIMIT,
) -> Page:
    return Page(offset=offset, limit=limit)


PageDep = Annotated[Page, Depends(page)]


def count(session: Session, query: Select[Any]) -> int:
    return session.scalar(select(func.count()).select_from(query.order_by(None).subquery())) or 0


def with_total(response: Response, total: int, items: list[T]) -> list[T]:
    """`items`, the page, with how many there are in all in the response's header."""
    response.headers[TOTAL_HEADER] = str(total)
    return items


def cut(response: Response, page: Page, items: list[T]) -> list[T]:
    """A page of a list already read whole (one bounded by what admins create: users,
    nodes, windows, projects), with its count."""
    return with_total(response, len(items), page.cut(items))
