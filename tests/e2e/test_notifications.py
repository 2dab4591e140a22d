"""A job's webhook through the real stack: API -> scheduler -> agent -> reports -> the
notification outbox -> the scheduler's beat -> an HTTP server on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.notifications.receiver import Receiver
from tests.support.stack import Stack
from tests.support.wait import poll

pytestmark = pytest.mark.e2e

STACK_AGENTS = {"n1": "sim:1:H100-80GB"}
STACK_ENV = {"GPUSCHED_NOTIFY_HOSTS": "127.0.0.1"}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


def test_a_job_that_fails_posts_its_end_to_the_hook(stack: Stack, receiver: Receiver) -> None:
    job = stack.submit(
        {
            "command": "sleep 0.3; exit 3",
            "gpus": 1,
            "notify_url": receiver.url,
            "notify_on": ["fail"],
        }
    )
    stack.wait_status(job["id"], "FAILED", "SUCCEEDED")
    poll("the hook was called", lambda: receiver.bodies or None)
    (body,) = receiver.bodies
    assert body["text"] == f"job {job['id']} (sleep) of admin ended: FAILED, exit code 3"
    assert (body["event"], body["job"]["exit_code"]) == ("fail", 3)
