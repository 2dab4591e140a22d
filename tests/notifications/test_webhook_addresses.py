"""Webhooks cannot reach inside (OWASP's SSRF guidance): a URL's host is resolved and its
addresses checked when it is submitted and again when a message is sent, the message goes
to the address checked, redirects are not followed, and the job's owner reads only
"delivery failed" (the server's log says why).

Names are resolved by a stub of `app.notifications.hosts.resolve`, the one function the
code resolves with: no query leaves this machine, and no test connects anywhere but to a
receiver on loopback. Where a connection must not be made, httpx's network transport
fails the test if it is called."""

from __future__ import annotations

from collections.abc import Callable
from ipaddress import ip_address
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from app.db import utcnow
from app.jobs.webhooks import send_due
from app.notifications import hosts
from app.notifications.models import Notification
from tests.cycle.jobs_api import job_events, submit
from tests.notifications.receiver import Receiver

ANY = frozenset({"*"})
PUBLIC = "93.184.215.14"  # a global address: only ever resolved to, never connected to
INTERNAL_URLS = [
    "http://127.0.0.1/hook",
    "http://10.0.0.1/hook",
    "http://169.254.169.254/latest/meta-data/",  # the cloud metadata service
    "http://[::1]:8080/hook",
    "http://[::ffff:127.0.0.1]/hook",  # 127.0.0.1 written as IPv6
    "http://0.0.0.0/hook",
    "http://224.0.0.1/hook",  # multicast
    "http://100.64.0.1/hook",  # carrier-grade NAT
    "http://inside.example.test/hook",  # a name the stub resolves to 127.0.0.1
    "http://nowhere.example.test/hook",  # a name that resolves to nothing
]


@pytest.fixture
def names(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Name -> the addresses the stub resolves it to (a name not listed: not found);
    literal addresses resolve to themselves, as getaddrinfo does without a query."""
    table: dict[str, list[str]] = {"inside.example.test": ["127.0.0.1"]}

    def resolve(host: str, port: int) -> list[Any]:
        try:
            return [ip_address(host)]
        except ValueError:
            pass
        if host not in table:
            raise OSError(f"stub: {host} not found")
        return [ip_address(a) for a in table[host]]

    monkeypatch.setattr(hosts, "resolve", resolve)
    return table


@pytest.fixture
def no_connection(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Fails any HTTP request the sender would make; the list records what was tried."""
    tried: list[str] = []

    def handle(self: httpx.HTTPTransport, request: httpx.Request) -> httpx.Response:
        tried.append(str(request.url))
        raise AssertionError(f"a connection to {request.url} was made")

    # The network transport only: the tests' own client talks to the app in process.
    monkeypatch.setattr(httpx.HTTPTransport, "handle_request", handle)
    return tried


def _allow(api: Any, allowed: str) -> None:
    state = api.client.app.state
    state.settings = state.settings.model_copy(update={"notify_hosts": allowed})


def _refusal(r: httpx.Response) -> str:
    assert r.status_code == 422, r.text
    (error,) = r.json()["errors"]
    assert error["loc"] == ["body", "notify_url"]
    return str(error["msg"])


@pytest.mark.parametrize("url", INTERNAL_URLS)
def test_star_admits_public_addresses_only(
    api: Any, names: dict[str, list[str]], no_connection: list[str], url: str
) -> None:
    _allow(api, "*")
    alice = api.as_("alice")
    body = {"command": ["t"], "notify_url": url, "hold": True}
    message = _refusal(api.client.post("/api/v1/jobs", json=body, headers=alice))
    # One message whether the name resolves inside or not at all: no probe of inside names.
    host = httpx.URL(url).host
    assert message == (
        f"host {host} does not resolve to public addresses only; a host inside the network "
        "needs an admin to name it in GPUSCHED_NOTIFY_HOSTS"
    )
    _refusal(api.client.patch("/api/v1/me", json={"notify_url": url}, headers=alice))
    job = submit(api, hold=True)["id"]
    _refusal(api.client.patch(f"/api/v1/jobs/{job}", json={"notify_url": url}, headers=alice))
    assert no_connection == []


def test_a_public_name_is_admitted_under_star(api: Any, names: dict[str, list[str]]) -> None:
    names["hooks.example.test"] = [PUBLIC]
    _allow(api, "*")
    job = submit(api, notify_url="https://hooks.example.test/x", hold=True)
    assert job["notify_url"] == "https://hooks.example.test/x"
    # One internal address among public ones is enough to refuse it.
    names["mixed.example.test"] = [PUBLIC, "10.1.2.3"]
    body = {"command": ["t"], "notify_url": "https://mixed.example.test/x"}
    _refusal(api.client.post("/api/v1/jobs", json=body, headers=api.as_("alice")))


def _queue_end_message(api: Any, url: str) -> int:
    job: int = submit(api, notify_url=url, hold=True)["id"]
    r = api.client.post(f"/api/v1/jobs/{job}/cancel", headers=api.as_("alice"))
    assert r.status_code == 200, r.text
    return job


def _message(api: Any) -> Notification:
    with api.factory() as session:
        (message,) = session.scalars(select(Notification))
        return message


def test_a_name_rebound_inside_after_the_check_is_not_sent_to(
    api: Any,
    names: dict[str, list[str]],
    no_connection: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """DNS rebinding: public when submitted, 127.0.0.1 when the message is sent."""
    names["rebind.example.test"] = [PUBLIC]
    _allow(api, "*")
    job = _queue_end_message(api, "http://rebind.example.test/hook")
    names["rebind.example.test"] = ["127.0.0.1"]
    report = send_due(factory=api.factory, now=utcnow(), allowed_hosts=ANY)
    assert (report.sent, report.failed) == (0, 1)
    assert no_connection == []
    assert _message(api).error == "delivery failed"
    assert "resolves to 127.0.0.1, not a public address" in caplog.text
    r = api.client.get(f"/api/v1/jobs/{job}/notifications", headers=api.as_("alice"))
    assert r.json()[0]["error"] == "delivery failed" and "127.0.0.1" not in r.json()[0]["error"]


def test_the_message_goes_to_the_address_checked(
    api: Any, names: dict[str, list[str]], receiver: Receiver
) -> None:
    """A host the admin names may be inside. It is resolved once, by the check, and the
    message sent to that address with the name in its Host header: `hook.example.test`
    resolves nowhere but in the stub, so a second resolution by name would fail."""
    names["hook.example.test"] = ["127.0.0.1"]
    allowed = frozenset({"hook.example.test"})
    _allow(api, "hook.example.test")
    _queue_end_message(api, f"http://hook.example.test:{receiver.port}/hook")
    report = send_due(factory=api.factory, now=utcnow(), allowed_hosts=allowed)
    assert report.sent == 1, _message(api).error
    assert receiver.hosts == [f"hook.example.test:{receiver.port}"]
    assert receiver.bodies[0]["event"] == "end"


def test_a_redirect_is_not_followed(api: Any, receiver: Receiver) -> None:
    target = Receiver()
    try:
        receiver.status, receiver.location = 307, target.url
        _queue_end_message(api, receiver.url)
        report = send_due(factory=api.factory, now=utcnow(), allowed_hosts=frozenset({"127.0.0.1"}))
        assert (report.sent, report.failed) == (0, 1)
        assert len(receiver.bodies) == 1 and target.bodies == []
        assert _message(api).error == "delivery failed"
    finally:
        target.server.shutdown()


@pytest.mark.parametrize("answer", ["open port, 401", "closed port"])
def test_an_open_port_reads_as_a_closed_one(
    api: Any,
    receiver: Receiver,
    refused_port: Callable[[], int],
    caplog: pytest.LogCaptureFixture,
    answer: str,
) -> None:
    """The owner of a hook to a host inside (one the admin named) cannot tell what answers
    there: the message's error and the job's history say "delivery failed" either way."""
    if answer == "closed port":
        url = f"http://127.0.0.1:{refused_port()}/hook"
    else:
        receiver.status, url = 401, receiver.url
    job = _queue_end_message(api, url)
    for _ in range(5):
        with api.factory() as session:  # due again at once
            session.execute(Notification.__table__.update().values(next_at=utcnow()))
            session.commit()
        send_due(factory=api.factory, now=utcnow(), allowed_hosts=frozenset({"127.0.0.1"}))
    assert _message(api).error == "delivery failed"
    assert job_events(api, job)[-1]["reason"] == (
        "end notification to 127.0.0.1 not delivered after 5 tries: delivery failed"
    )
    assert ("HTTP 401" if answer == "open port, 401" else "no answer from 127.0.0.1") in (
        caplog.text
    )


@pytest.fixture
def refused_port() -> Any:
    """A loopback port nothing listens on (bound, never listening: no one else takes it)."""
    import socket

    sockets: list[socket.socket] = []

    def port() -> int:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)
        return int(sock.getsockname()[1])

    yield port
    for sock in sockets:
        sock.close()
