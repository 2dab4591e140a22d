"""Job notifications by webhook (sbatch --mail-type): what a state change queues, in its
own transaction, and how the sender delivers it to a real HTTP server, retries with
backoff and gives up saying so."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from app.config import Settings
from app.cycle.settings import SchedulerSettings
from app.db import utcnow
from app.jobs.agent_reports import job_started
from app.jobs.limits import runtime_limits
from app.jobs.models import Job
from app.jobs.outbox import event_for
from app.jobs.states import JobStatus
from app.jobs.webhooks import MAX_ATTEMPTS, send_due
from app.messaging import SEND_NOTIFICATIONS
from app.notifications.models import Notification
from app.wire import Finished, Started
from tests.batches.test_batches_cli import batch
from tests.cli.conftest import Cli
from tests.cycle.jobs_api import add_node, finish, job_events, run_one_cycle, submit
from tests.notifications.receiver import Receiver
from workers.job_reports import apply_job_reports
from workers.scheduler import build_scheduler_app

HOSTS = frozenset({"127.0.0.1"})


@pytest.mark.parametrize(
    ("notify_on", "to", "ends", "event"),
    [
        (["end"], JobStatus.SUCCEEDED, True, "end"),
        (["end"], JobStatus.CANCELLED, True, "end"),
        (["end"], JobStatus.RUNNING, False, None),
        (["start"], JobStatus.RUNNING, False, "start"),
        (["fail"], JobStatus.SUCCEEDED, True, None),
        (["fail"], JobStatus.TIMED_OUT, True, "fail"),
        (["end", "fail"], JobStatus.FAILED, True, "end"),  # one message, not two
        (["end"], JobStatus.FAILED, False, None),  # a retry follows: not its end
        (["end"], JobStatus.PREEMPTED, False, None),  # back to the queue
    ],
)  # fmt: skip
def test_which_changes_call_for_a_message(
    notify_on: list[str], to: JobStatus, ends: bool, event: str | None
) -> None:
    assert event_for(Job(notify_on=notify_on), to, ends=ends) == event


@pytest.mark.parametrize(
    ("notify_on", "came_from", "cancel_asked", "event"),
    [
        (["requeue"], JobStatus.PREEMPTED, False, "requeue"),  # preempted or requeued
        (["requeue"], JobStatus.LOST, False, "requeue"),  # its node was lost
        (["requeue"], JobStatus.FAILED, False, "requeue"),  # a retry
        (["end"], JobStatus.PREEMPTED, False, None),  # not asked for
        (["requeue"], JobStatus.PREEMPTED, True, None),  # on its way to CANCELLED
    ],
)  # fmt: skip
def test_a_job_back_in_the_queue_is_a_requeue(
    notify_on: list[str], came_from: JobStatus, cancel_asked: bool, event: str | None
) -> None:
    job = Job(notify_on=notify_on, cancel_requested_at=utcnow() if cancel_asked else None)
    assert event_for(job, JobStatus.PENDING, ends=False, came_from=came_from) == event


def test_a_requeued_job_is_announced_then_its_end(api, receiver: Receiver) -> None:
    add_node(api, 1)
    job = submit(api, name="train", notify_url=receiver.url, notify_on=["requeue", "end"])["id"]
    run_one_cycle(api)
    r = api.client.post(f"/api/v1/jobs/{job}/requeue", headers=api.as_("alice"))
    assert r.status_code == 200, r.text
    finish(api, job, "PREEMPTED")  # the agent stopped it
    run_one_cycle(api)
    finish(api, job, "SUCCEEDED")
    assert send_due(factory=api.factory, now=utcnow(), allowed_hosts=HOSTS).sent == 2
    requeued, ended = receiver.bodies
    assert requeued["event"] == "requeue"
    assert (
        requeued["text"]
        == f"job {job} (train) of alice is back in the queue (attempt 1: PREEMPTED)"
    )
    assert (requeued["job"]["status"], ended["event"], ended["job"]["attempt"]) == (
        "PENDING",
        "end",
        2,
    )


def test_a_failure_that_is_retried_is_not_an_end(api, receiver: Receiver) -> None:
    add_node(api, 1)
    job = submit(api, retries=1, notify_url=receiver.url)["id"]
    for attempt_ends in ("FAILED", "FAILED"):  # retried once, then failed for good
        run_one_cycle(api)
        finish(api, job, attempt_ends)
    assert send_due(factory=api.factory, now=utcnow(), allowed_hosts=HOSTS).sent == 1
    (body,) = receiver.bodies
    assert (body["job"]["status"], body["job"]["attempt"]) == ("FAILED", 2)


S = JobStatus


@pytest.mark.parametrize(
    ("notify_on", "to", "others", "event"),
    [
        (["start"], S.RUNNING, [S.PENDING, S.PENDING], "start"),  # the first task
        (["start"], S.RUNNING, [S.RUNNING, S.PENDING], None),
        (["end"], S.SUCCEEDED, [S.SUCCEEDED, S.RUNNING], None),  # not the last
        (["end"], S.SUCCEEDED, [S.SUCCEEDED, S.FAILED], "end"),
        (["fail"], S.SUCCEEDED, [S.SUCCEEDED, S.FAILED], "fail"),  # a task failed
        (["fail"], S.SUCCEEDED, [S.SUCCEEDED, S.SUCCEEDED], None),
    ],
)  # fmt: skip
def test_an_array_is_announced_as_a_whole(
    notify_on: list[str], to: JobStatus, others: list[JobStatus], event: str | None
) -> None:
    ends = to is not S.RUNNING
    assert event_for(Job(notify_on=notify_on), to, ends=ends, others=others) == event


def test_an_array_ends_in_one_message(api, receiver: Receiver) -> None:
    add_node(api, 2)
    first = submit(api, name="sweep", array={"indices": "0-2"}, notify_url=receiver.url)["id"]
    run_one_cycle(api)
    finish(api, first, "SUCCEEDED")
    finish(api, first + 1, "FAILED")
    run_one_cycle(api)
    assert send_due(factory=api.factory, now=utcnow(), allowed_hosts=HOSTS).sent == 0
    finish(api, first + 2, "SUCCEEDED")
    assert send_due(factory=api.factory, now=utcnow(), allowed_hosts=HOSTS).sent == 1
    (body,) = receiver.bodies
    assert body["text"] == f"array {first} (sweep) of alice ended: 1 FAILED, 2 SUCCEEDED"
    assert body["array"] == {"id": first, "tasks": {"FAILED": 1, "SUCCEEDED": 2}}


def test_an_array_whose_last_tasks_end_in_one_run_of_reports_ends_in_one_message(
    api, receiver: Receiver
) -> None:
    add_node(api, 3)
    first = submit(api, name="sweep", array={"indices": "0-2"}, notify_url=receiver.url)["id"]
    run_one_cycle(api)
    with api.factory.begin() as session:  # as a reports drain applies a run: one transaction
        ends = [
            Finished(node="n1", job_id=job, attempt=1, result="SUCCEEDED")
            for job in (first, first + 1, first + 2)
        ]
        apply_job_reports(session, ends)

    assert send_due(factory=api.factory, now=utcnow(), allowed_hosts=HOSTS).sent == 1
    (body,) = receiver.bodies
    assert body["array"] == {"id": first, "tasks": {"SUCCEEDED": 3}}


def test_a_url_the_server_would_not_notify_is_refused_naming_the_field(api) -> None:
    for url, message in [
        ("ftp://127.0.0.1/x", "expected an http:// or https:// URL"),
        (
            "https://hooks.example.com/x",
            "host hooks.example.com is not allowed here (allowed: 127.0.0.1)",
        ),
    ]:
        body = {"command": ["t"], "notify_url": url}
        r = api.client.post("/api/v1/jobs", json=body, headers=api.as_("alice"))
        assert r.status_code == 422, r.text
        assert r.json()["errors"][0]["loc"] == ["body", "notify_url"]
        assert r.json()["errors"][0]["msg"] == message
    r = api.client.post(
        "/api/v1/jobs", json={"command": ["t"], "notify_on": ["never"]}, headers=api.as_("alice")
    )
    assert r.status_code == 422 and r.json()["errors"][0]["loc"][:2] == ["body", "notify_on"]


def test_notifications_are_off_unless_an_admin_allows_hosts(tmp_path: Path) -> None:
    off = runtime_limits(Settings(data_dir=tmp_path))
    from app.errors import FieldError
    from app.jobs.schemas import JobCreate

    with pytest.raises(FieldError, match="notifications are off on this server"):
        off.apply(JobCreate(command=["t"], notify_url="http://127.0.0.1/x"))
    kept = build_scheduler_app(Settings(data_dir=tmp_path), SchedulerSettings())
    assert kept.conf.beat_schedule["send-notifications"]["task"] == SEND_NOTIFICATIONS


def test_a_job_is_announced_when_it_starts_and_ends(api, receiver: Receiver) -> None:
    add_node(api, 1)
    job = submit(api, name="train", notify_url=receiver.url, notify_on=["start", "end"])
    assert (job["notify_url"], job["notify_on"]) == (receiver.url, ["end", "start"])
    run_one_cycle(api)
    with api.factory.begin() as session:
        job_started(session=session, report=Started(job_id=job["id"], attempt=1, node="n1"))
    finish(api, job["id"], "SUCCEEDED")

    report = send_due(factory=api.factory, now=utcnow(), allowed_hosts=HOSTS)
    assert (report.sent, report.failed) == (2, 0)
    assert [b["text"] for b in receiver.bodies] == [
        f"job {job['id']} (train) of alice started",
        f"job {job['id']} (train) of alice ended: SUCCEEDED",
    ]
    ended = receiver.bodies[1]
    assert ended["event"] == "end"
    assert {k: ended["job"][k] for k in ("id", "user", "project", "status", "attempt")} == {
        "id": job["id"], "user": "alice", "project": "ml", "status": "SUCCEEDED", "attempt": 1,
    }  # fmt: skip
    assert ended["job"]["finished_at"] is not None
    # Delivered once: nothing is due any more.
    assert (
        send_due(factory=api.factory, now=utcnow() + timedelta(hours=1), allowed_hosts=HOSTS).sent
        == 0
    )


def test_a_failing_hook_is_retried_with_backoff_then_given_up_in_the_jobs_history(
    api, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    """Its owner reads "delivery failed" (the status would tell an open port from a
    closed one); the server's log has the answer."""
    add_node(api, 1)
    job = submit(api, notify_url=receiver.url, notify_on=["fail"])["id"]
    run_one_cycle(api)
    finish(api, job, "FAILED")
    receiver.status = 500
    now = utcnow()
    tried_at = []
    for minute in range(12):  # backoff: 30 s, 1, 2, 4 minutes
        at = now + timedelta(minutes=minute)
        report = send_due(factory=api.factory, now=at, allowed_hosts=HOSTS)
        if report.failed or report.given_up:
            tried_at.append(minute)
    assert tried_at == [0, 1, 2, 4, 8]
    assert len(receiver.bodies) == MAX_ATTEMPTS
    with api.factory() as session:
        (message,) = session.scalars(select(Notification))
        assert (message.sent_at, message.attempts, message.error) == (
            None,
            MAX_ATTEMPTS,
            "delivery failed",
        )
    assert job_events(api, job)[-1]["reason"] == (
        "fail notification to 127.0.0.1 not delivered after 5 tries: delivery failed"
    )
    assert "try 5: HTTP 500 from 127.0.0.1" in caplog.text


def test_a_host_no_longer_allowed_is_given_up_at_once(api, receiver: Receiver) -> None:
    job = submit(api, notify_url=receiver.url, hold=True)["id"]
    api.client.post(f"/api/v1/jobs/{job}/cancel", headers=api.as_("alice"))
    report = send_due(factory=api.factory, now=utcnow(), allowed_hosts=frozenset())
    assert (report.given_up, receiver.bodies) == (1, [])
    assert job_events(api, job)[-1]["reason"] == (
        "end notification to 127.0.0.1 not delivered: host no longer allowed "
        "(GPUSCHED_NOTIFY_HOSTS)"
    )


def test_a_hook_that_does_not_answer_is_retried(api, caplog: pytest.LogCaptureFixture) -> None:
    job = submit(api, notify_url="http://127.0.0.1:9/hook", hold=True)["id"]  # discard port
    api.client.post(f"/api/v1/jobs/{job}/cancel", headers=api.as_("alice"))
    report = send_due(factory=api.factory, now=utcnow(), allowed_hosts=HOSTS)
    assert (report.sent, report.failed) == (0, 1)
    with api.factory() as session:
        (message,) = session.scalars(select(Notification))
        assert (message.attempts, message.error) == (1, "delivery failed")
    assert "try 1: no answer from 127.0.0.1" in caplog.text


def test_submit_with_a_notification_from_the_cli(cli: Cli) -> None:
    url = "http://127.0.0.1:8/hook"
    result = cli("submit", "--json", "--notify", url, "--notify-on", "start, fail", "--", "true")
    assert result.exit_code == 0, result.stderr
    job = json.loads(result.stdout)
    assert (job["notify_url"], job["notify_on"]) == (url, ["fail", "start"])
    assert f"notifies {url} on fail, start" in " ".join(cli("show", str(job["id"])).stdout.split())
    refused = cli("submit", "--notify", "https://example.com/x", "--", "true")
    assert refused.exit_code == 1 and "host example.com is not allowed here" in refused.stderr
    no_url = cli("submit", "--notify-on", "end", "--", "true")
    assert no_url.exit_code == 1
    assert "notify_url: notify_on needs a notify_url: give one, or set your default" in (
        " ".join(no_url.stderr.split())
    )


def test_update_changes_a_jobs_notifications_from_the_cli(cli: Cli) -> None:
    """As scontrol update MailType= / MailUser=; a job without a URL takes its owner's."""
    url = "http://127.0.0.1:8/hook"
    job = json.loads(cli("submit", "--json", "--hold", "--", "true").stdout)["id"]
    refused = cli("update", str(job), "--notify-on", "fail")
    assert refused.exit_code == 1 and "set its owner's default" in " ".join(refused.stderr.split())
    assert cli("me", "--notify", url).exit_code == 0
    changed = cli("update", str(job), "--json", "--notify-on", "fail,requeue")
    assert changed.exit_code == 0, changed.stderr
    assert json.loads(changed.stdout)["notify_url"] == url
    assert json.loads(changed.stdout)["notify_on"] == ["fail", "requeue"]
    other = "http://127.0.0.1:9/other"
    assert (
        json.loads(cli("update", str(job), "--json", "--notify", other).stdout)["notify_url"]
        == other
    )
    cleared = json.loads(cli("update", str(job), "--json", "--notify", "none").stdout)
    assert cleared["notify_url"] is None


def test_a_job_whose_host_was_removed_since_can_still_be_changed(api) -> None:
    """The URL was admitted; removing its host stops its messages (above), not every
    other change of the job. A new URL is judged by the hosts allowed now."""
    job = submit(api, notify_url="http://127.0.0.1:9/hook", hold=True)["id"]
    state = api.client.app.state
    state.settings = state.settings.model_copy(update={"notify_hosts": "hooks.example.org"})
    path, alice = f"/api/v1/jobs/{job}", api.as_("alice")

    r = api.client.patch(path, json={"priority": -3}, headers=alice)
    assert r.status_code == 200, r.text
    assert r.json()["notify_url"] == "http://127.0.0.1:9/hook"
    r = api.client.patch(path, json={"notify_url": "http://127.0.0.1:8/hook"}, headers=alice)
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "notify_url"]
    r = api.client.patch(path, json={"notify_url": None}, headers=alice)
    assert r.status_code == 200 and r.json()["notify_url"] is None


def _deliveries(api, job: int, user: str = "alice") -> list[dict]:
    r = api.client.get(f"/api/v1/jobs/{job}/notifications", headers=api.as_(user))
    assert r.status_code == 200, r.text
    return r.json()


def test_a_jobs_deliveries_are_readable_queued_retrying_delivered(api, receiver: Receiver) -> None:
    """GET /jobs/{id}/notifications: each message and how its delivery went, so a hook
    that never fired is told apart from one that failed."""
    job = submit(api, notify_url=receiver.url, hold=True)["id"]
    assert _deliveries(api, job) == []
    api.client.post(f"/api/v1/jobs/{job}/cancel", headers=api.as_("alice"))
    (queued,) = _deliveries(api, job)
    assert {k: queued[k] for k in ("event", "url", "state", "attempts", "sent_at", "error")} == {
        "event": "end", "url": receiver.url, "state": "queued", "attempts": 0, "sent_at": None,
        "error": None,
    }  # fmt: skip

    receiver.status = 503
    now = utcnow()
    send_due(factory=api.factory, now=now, allowed_hosts=HOSTS)
    (retrying,) = _deliveries(api, job)
    assert (retrying["state"], retrying["attempts"], retrying["error"]) == (
        "retrying",
        1,
        "delivery failed",
    )
    assert retrying["next_at"] == (now + timedelta(seconds=30)).isoformat().replace("+00:00", "Z")

    receiver.status = 200
    send_due(factory=api.factory, now=now + timedelta(minutes=1), allowed_hosts=HOSTS)
    (delivered,) = _deliveries(api, job)
    assert (delivered["state"], delivered["attempts"], delivered["error"]) == ("delivered", 2, None)
    assert delivered["sent_at"] is not None and delivered["next_at"] is None
    # Who may see the job may see its messages; another project's member may not.
    r = api.client.get(f"/api/v1/jobs/{job}/notifications", headers=api.as_("bob"))
    assert r.status_code == 403


def test_a_given_up_message_says_so(api) -> None:
    job = submit(api, notify_url="http://127.0.0.1:9/hook", hold=True)["id"]
    api.client.post(f"/api/v1/jobs/{job}/cancel", headers=api.as_("alice"))
    send_due(factory=api.factory, now=utcnow(), allowed_hosts=frozenset())
    (given_up,) = _deliveries(api, job)
    assert (given_up["state"], given_up["next_at"]) == ("given_up", None)
    assert "no longer allowed" in given_up["error"]
    # For an alert on a webhook that is down.
    metrics = api.client.get("/metrics").text
    assert 'gpusched_notifications_undelivered{state="given_up"} 1.0' in metrics
    assert 'gpusched_notifications_undelivered{state="queued"} 0.0' in metrics


def test_show_prints_how_notifications_were_delivered(cli: Cli) -> None:
    submitted = cli(
        "submit", "--json", "--hold", "--notify", "http://127.0.0.1:9/hook", "--", "true"
    )
    job = json.loads(submitted.stdout)["id"]
    assert cli("cancel", str(job)).exit_code == 0
    shown = cli("show", str(job))
    assert shown.exit_code == 0, shown.stderr
    assert "Notifications" in shown.stdout and "queued" in shown.stdout
    as_json = json.loads(cli("show", "--json", str(job)).stdout)
    assert [(n["event"], n["state"]) for n in as_json["notifications"]] == [("end", "queued")]


def test_a_batch_job_from_the_command_line_takes_notification_and_node_options(
    cli: Cli,
) -> None:
    """`batch create` takes the job options of `submit`, these four included."""
    url = "http://127.0.0.1:8/hook"
    created = batch(
        cli, "create", "nightly", "--cron", "0 2 * * *", "--json",
        "--notify", url, "--notify-on", "fail,requeue", "-x", "node-3", "--", "true",
    )  # fmt: skip
    assert created.exit_code == 0, created.stderr
    (template,) = json.loads(created.stdout)["templates"]
    assert (template["notify_url"], template["notify_on"]) == (url, ["fail", "requeue"])
    assert template["exclude_nodes"] == ["node-3"]
    no_url = batch(cli, "create", "b2", "--cron", "0 2 * * *", "--notify-on", "end", "--", "true")
    assert no_url.exit_code == 1 and "notify_on needs a notify_url" in no_url.stderr


def test_a_users_default_url_receives_the_notifications_of_jobs_without_one(
    api, receiver: Receiver
) -> None:
    """As Slurm mails the submitting user: `notify_on` alone posts to the user's default
    (PATCH /api/v1/me), checked against the allowed hosts like a job's own URL."""
    alice, admin = api.as_("alice"), api.as_("admin")
    r = api.client.patch(
        "/api/v1/me", json={"notify_url": "https://hooks.example.org/x"}, headers=alice
    )
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "notify_url"]
    r = api.client.patch("/api/v1/me", json={"notify_url": receiver.url}, headers=alice)
    assert r.status_code == 200 and r.json()["notify_url"] == receiver.url
    assert api.client.get("/api/v1/me", headers=alice).json()["notify_url"] == receiver.url

    # Stored on the job (a later change of the default leaves it); no notify_on: none.
    asked = submit(api, notify_on=["end"], hold=True)
    assert asked["notify_url"] == receiver.url
    assert submit(api, hold=True)["notify_url"] is None
    own = submit(api, notify_on=["end"], notify_url="http://127.0.0.1:9/own", hold=True)
    assert own["notify_url"] == "http://127.0.0.1:9/own"
    api.client.post(f"/api/v1/jobs/{asked['id']}/cancel", headers=alice)
    assert send_due(factory=api.factory, now=utcnow(), allowed_hosts=HOSTS).sent == 1
    assert [b["job"]["id"] for b in receiver.bodies] == [asked["id"]]

    # A change that asks for notifications of a job without a URL takes the default too
    # (by an admin as well: the owner's), unless it says null.
    for headers in (alice, admin):  # the admin has no default: alice's is taken
        silent = submit(api, hold=True)["id"]
        r = api.client.patch(
            f"/api/v1/jobs/{silent}", json={"notify_on": ["fail"]}, headers=headers
        )
        assert r.status_code == 200 and r.json()["notify_url"] == receiver.url, r.text
    quiet = submit(api, hold=True)["id"]
    r = api.client.patch(
        f"/api/v1/jobs/{quiet}", json={"notify_on": ["fail"], "notify_url": None}, headers=alice
    )
    assert r.status_code == 200 and r.json()["notify_url"] is None

    r = api.client.patch("/api/v1/me", json={"notify_url": None}, headers=alice)
    assert r.status_code == 200 and r.json()["notify_url"] is None
    r = api.client.post(
        "/api/v1/jobs", json={"command": ["true"], "notify_on": ["fail"]}, headers=alice
    )
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "notify_url"]
    r = api.client.patch(f"/api/v1/jobs/{quiet}", json={"notify_on": ["end"]}, headers=alice)
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "notify_url"]


def test_me_sets_and_shows_the_default_url(cli: Cli) -> None:
    url = "http://127.0.0.1:8/hook"
    assert cli("me", "--notify", url).stdout.splitlines() == [
        "alice (user) in project(s) ml",
        f"notifications: {url}",
    ]
    job = json.loads(cli("submit", "--json", "--notify-on", "fail", "--", "true").stdout)
    assert (job["notify_url"], job["notify_on"]) == (url, ["fail"])
    assert "no default URL" in cli("me", "--no-notify").stdout
    both = cli("me", "--notify", url, "--no-notify")
    assert both.exit_code == 2 and "not both" in both.stderr
