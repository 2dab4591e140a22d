"""Which waiting jobs' reasons a full cycle writes (`changed_reasons`): only those that
differ from the row's, a job ranked for the first time gets its place as its queue key,
and a key once set is kept when the order changes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from app.scheduling.cycle_state import pending_reason
from app.scheduling.stored import changed_reasons, still_waiting
from app.scheduling.types import ReasonKind
from tests.scheduling.builders import T0


@dataclass
class Row:
    reasons: tuple[Any, ...]


WAITING = ReasonKind.WAITING_FOR_GPUS


def test_only_changed_reasons_are_written_and_keys_are_kept():
    later = T0 + timedelta(hours=1)
    waiting = [
        pending_reason(1, WAITING, "no room", 1, None),  # as stored
        pending_reason(2, WAITING, "no room", 2, later),  # its estimate moved
        pending_reason(3, WAITING, "x" * 600, 3, None),  # new to the rows read
        pending_reason(4, ReasonKind.PRIORITY, "behind 1", 4, None),  # NEW, never ranked
        pending_reason(5, WAITING, "no room", 5, None),  # ranked before at place 2
    ]
    stored = {
        1: Row((WAITING.value, "no room", 7, None)),
        2: Row((WAITING.value, "no room", 1, None)),
        4: Row((ReasonKind.NEW.value, "submitted", None, None)),
        5: Row((WAITING.value, "no room", 2, None)),
    }
    assert changed_reasons(waiting, stored, max_message=512) == [
        (2, WAITING.value, "no room", 1, later),
        (3, WAITING.value, "x" * 512, 3, None),
        (4, ReasonKind.PRIORITY.value, "behind 1", 4, None),
    ]


def test_jobs_placed_leave_the_waiting_in_order():
    waiting = [pending_reason(i, WAITING, "no room", i, None) for i in (4, 7, 2, 9)]
    assert [r.job_id for r in still_waiting(waiting, {7, 9})] == [4, 2]
    assert still_waiting(waiting, set()) is waiting  # none placed: not copied
