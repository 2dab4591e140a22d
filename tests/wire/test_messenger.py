"""Orders leave the control plane in one Redis pipeline (`Messenger.send`), through a real
private valkey: each reaches its node's queue sealed for that node, with no queue
declared, and a batch that cannot be sent is reported unsent, whole, without raising into
the caller."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
from kombu.transport import redis as kombu_redis

from app.cli.up import start_private_redis
from app.jobs.orders import AfterCommit
from app.messaging import SCHEDULE_CYCLE, SCHEDULER_QUEUE, Messenger, create_celery
from app.nodes.keys import node_key
from app.wire import ORDER_TYPES, RunJob, StopJob, node_queue, unseal
from workers.heartbeats import task_kwargs

SECRET = b"m" * 32


def keys(node: str) -> bytes:
    return node_key(SECRET, node)


def run_order(node: str, job_id: int) -> RunJob:
    return RunJob(
        node=node,
        job_id=job_id,
        attempt=1,
        command=("sleep", "5"),
        gpu_indices=(job_id % 8,),
        master_port=29500,
        unix_user="alice",
    )


def test_a_cycles_orders_reach_each_nodes_queue_sealed_for_it(tmp_path: Path) -> None:
    server, url = start_private_redis(tmp_path / "redis")
    try:
        client = redis.Redis.from_url(url)
        messenger = Messenger(create_celery(url), client, keys=keys, run_expires_s=60)
        nodes = [f"node-{i}" for i in range(10)]
        orders = [run_order(nodes[i % 10], i) for i in range(1, 2_001)]
        stop = StopJob(node="node-3", job_id=7, attempt=1, reason="cancel")

        assert messenger.send(AfterCommit.of([*orders, stop])) == ()

        for node in nodes:
            raws = client.lrange(node_queue(node), 0, -1)[::-1]  # pushed left: oldest last
            received = [
                unseal(task_kwargs(raw) or {}, types=ORDER_TYPES, key_for=keys).message
                for raw in raws
            ]
            sent = [o for o in [*orders, stop] if o.node == node]
            assert received == sent
            for raw in raws:
                headers = json.loads(raw)["headers"]
                # A run order expires in its queue; the sealed kwargs are not repeated
                # in the message's repr (Celery's logs).
                assert (headers["expires"] is not None) == (headers["task"] == RunJob.TASK)
                assert headers["kwargsrepr"].startswith("<sealed ")
        # Sent through the anonymous exchange with nothing declared (declaring each
        # node's queue with each message cost two thirds of a send): no binding is made.
        assert client.keys("_kombu.binding.*") == []
    finally:
        server.stop()


def test_orders_that_cannot_reach_redis_are_reported_unsent(tmp_path: Path) -> None:
    server, url = start_private_redis(tmp_path / "redis")
    client = redis.Redis.from_url(url, socket_timeout=2)
    celery = create_celery(url)
    celery.conf.broker_connection_retry = False
    messenger = Messenger(celery, client, keys=keys)
    messenger.request_cycle()  # the connection is made while Redis is up
    server.stop()
    orders = (run_order("node-1", 1), run_order("node-2", 2))

    assert messenger.send(AfterCommit.of(orders)) == orders


def test_tasks_sent_one_by_one_share_one_redis_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kombu builds a redis client for each message published outside a batch (a cycle
    request, an agent's report); with redis-py 8 that was a fifth of a send's CPU."""
    built: list[bool] = []
    base = kombu_redis.Channel._create_client

    def counted(channel: kombu_redis.Channel, asynchronous: bool = False) -> object:
        built.append(asynchronous)
        return base(channel, asynchronous)

    monkeypatch.setattr(kombu_redis.Channel, "_create_client", counted)
    server, url = start_private_redis(tmp_path / "redis")
    try:
        celery = create_celery(url)
        for _ in range(20):
            celery.send_task(SCHEDULE_CYCLE)
        assert redis.Redis.from_url(url).llen(SCHEDULER_QUEUE) == 20
        assert built.count(False) == 1  # and the poll's own client, built once
    finally:
        server.stop()
