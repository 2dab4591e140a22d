"""Which time a heartbeat is judged at (pure; see heartbeat_taken_at)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.cycle.reconcile import heartbeat_taken_at

RECEIVED = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def test_the_agents_stamp_when_it_is_earlier() -> None:
    taken = RECEIVED - timedelta(seconds=300)  # e.g. redelivered five minutes late
    assert heartbeat_taken_at(taken.timestamp(), received_at=RECEIVED) == taken


def test_never_later_than_receipt() -> None:
    """An agent clock running ahead must not make attempts look older than they are."""
    ahead = (RECEIVED + timedelta(seconds=90)).timestamp()
    assert heartbeat_taken_at(ahead, received_at=RECEIVED) == RECEIVED


@pytest.mark.parametrize("stamp", [None, float("nan"), float("inf")])
def test_receipt_when_the_stamp_is_missing_or_unusable(stamp: float | None) -> None:
    # (One that is not a number at all is refused with the heartbeat: tests/wire.)
    assert heartbeat_taken_at(stamp, received_at=RECEIVED) == RECEIVED
