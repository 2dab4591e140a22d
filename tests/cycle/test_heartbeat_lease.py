"""Heartbeats drained by one reports process at a time (workers/heartbeats.py,
`DrainerLease`), against a real Redis: reports processes may be replicated for the job
reports' sake, and a node's heartbeats stored by two drains at once could be stored
older after newer."""

from __future__ import annotations

import threading
from typing import Any

import redis as redis_lib

from app.db import utcnow
from app.wire import HEARTBEATS_QUEUE
from tests.cycle.test_heartbeat_drain import context, heartbeat, queue_heartbeat, samples
from tests.foundation.builders import ready_node
from workers.heartbeats import DRAINER_KEY, DRAINER_TTL_S, DrainerLease, HeartbeatDrain


def drain(api: Any, redis: redis_lib.Redis, lease: DrainerLease) -> HeartbeatDrain:
    return HeartbeatDrain(context(api, redis), lease=lease)


def test_one_process_holds_the_lease_until_it_gives_it_up(redis: redis_lib.Redis) -> None:
    first, second = DrainerLease(redis), DrainerLease(redis)

    assert first.hold() and not second.hold()
    assert first.hold()  # renewed
    assert 0 < redis.ttl(DRAINER_KEY) <= DRAINER_TTL_S
    second.release()  # not its own: nothing happens
    assert not second.hold()
    first.release()
    assert second.hold() and not first.hold()


def test_a_lease_not_renewed_is_taken_over(redis: redis_lib.Redis) -> None:
    first, second = DrainerLease(redis), DrainerLease(redis)
    assert first.hold()
    redis.delete(DRAINER_KEY)  # as its expiry does, DRAINER_TTL_S after a holder died

    assert second.hold() and not first.hold()


def test_a_drain_that_lost_its_lease_drops_its_batch(api: Any, redis: redis_lib.Redis) -> None:
    with api.factory.begin() as session:
        session.add(ready_node("n1", gpus=1, now=utcnow()))
    stalled, taking_over = DrainerLease(redis), DrainerLease(redis)
    assert stalled.hold()
    queue_heartbeat(redis, heartbeat("n1", 10.0))
    redis.delete(DRAINER_KEY)
    assert taking_over.hold()

    # Taken before the lease lapsed, stored after: dropped, not stored beside the new
    # holder's (a snapshot stored after a newer one would go back in time).
    assert drain(api, redis, stalled).drain_once() == (0, 0)
    assert samples(api, "n1") == []

    queue_heartbeat(redis, heartbeat("n1", 20.0))
    assert drain(api, redis, taking_over).drain_once() == (1, 0)
    assert samples(api, "n1") == [20.0]


class OneRound(DrainerLease):
    """A lease whose holding is decided by the test; `run` stops after one round."""

    def __init__(self, redis: redis_lib.Redis, *, held: bool, stop: threading.Event) -> None:
        super().__init__(redis)
        self.held, self.stop = held, stop

    def hold(self) -> bool:
        self.stop.set()
        return self.held and super().hold()


def one_round(api: Any, redis: redis_lib.Redis, *, held: bool) -> None:
    """A node's heartbeat queued, then one round of a drain's `run`."""
    with api.factory.begin() as session:
        session.add(ready_node("n1", gpus=1, now=utcnow()))
    queue_heartbeat(redis, heartbeat("n1", 10.0))
    stop = threading.Event()
    drain(api, redis, OneRound(redis, held=held, stop=stop)).run(stop)


def test_a_process_without_the_lease_leaves_the_heartbeats_queued(
    api: Any, redis: redis_lib.Redis
) -> None:
    one_round(api, redis, held=False)

    assert redis.llen(HEARTBEATS_QUEUE) == 1
    assert samples(api, "n1") == []


def test_the_holder_drains_and_gives_the_lease_up_when_it_stops(
    api: Any, redis: redis_lib.Redis
) -> None:
    one_round(api, redis, held=True)

    assert redis.llen(HEARTBEATS_QUEUE) == 0
    assert samples(api, "n1") == [10.0]
    assert redis.get(DRAINER_KEY) is None  # another process takes over at once
