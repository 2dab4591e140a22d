"""The SQL statements some code sends: what the tests that count round trips read."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event


@dataclass(frozen=True, slots=True)
class Sent:
    statement: str
    parameters: Any
    executemany: bool


@contextmanager
def statements_sent(factory: Any) -> Iterator[list[Sent]]:
    """Every statement sent meanwhile through the engine of `factory` (a sessionmaker)."""
    sent: list[Sent] = []

    def record(_conn, _cursor, statement, parameters, _context, executemany) -> None:
        sent.append(Sent(statement, parameters, executemany))

    engine = factory.kw["bind"]
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", record)
