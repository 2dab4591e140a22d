"""No list grows a response without bound: each answers a page (`offset`, `limit`, at most
1000, 500 by default) with the count of all in X-Total-Count. A job changed thousands of
times answered all its events at once (a bulk cancel answered 19.5 MB)."""

from __future__ import annotations

from typing import Any

import pytest

from app.db import utcnow
from app.jobs.models import JobEvent
from app.jobs.states import JobStatus
from app.notifications.models import Notification
from tests.conftest import Api
from tests.foundation.builders import add_node

MANY = 1200


def _job_with_history(api: Api) -> int:
    r = api.client.post("/api/v1/jobs", json={"command": ["t"]}, headers=api.as_("alice"))
    job: int = r.json()["id"]
    now = utcnow()
    with api.factory() as session:  # as thousands of changes would have left it
        session.add_all(
            JobEvent(job_id=job, at=now, to_status=JobStatus.PENDING, actor="alice", reason=f"{i}")
            for i in range(MANY)
        )
        session.add_all(
            Notification(job_id=job, event="end", url="http://127.0.0.1:9/", body={}, attempts=0)
            for _ in range(MANY)
        )
        session.commit()
    return job


@pytest.mark.parametrize("what", ["events", "notifications"])
def test_a_jobs_history_comes_a_page_at_a_time(api: Api, what: str) -> None:
    job = _job_with_history(api)
    path, alice = f"/api/v1/jobs/{job}/{what}", api.as_("alice")
    total = MANY + 1 if what == "events" else MANY  # and its submission
    r = api.client.get(path, headers=alice)
    assert r.status_code == 200 and len(r.json()) == 500
    assert r.headers["x-total-count"] == str(total)
    r = api.client.get(path, params={"offset": 1000, "limit": 1000}, headers=alice)
    assert len(r.json()) == total - 1000 and r.headers["x-total-count"] == str(total)
    first = api.client.get(path, params={"limit": 2}, headers=alice).json()
    second = api.client.get(path, params={"offset": 1, "limit": 1}, headers=alice).json()
    assert second == first[1:]
    for params in ({"limit": 1001}, {"limit": 0}, {"offset": -1}):
        assert api.client.get(path, params=params, headers=alice).status_code == 422


def _create_batches(api: Api, n: int) -> None:
    for i in range(n):
        body = {"name": f"b{i}", "cron": "0 2 * * *", "templates": [{"command": ["t"]}]}
        r = api.client.post("/api/v1/batches", json=body, headers=api.as_("alice"))
        assert r.status_code == 201, r.text


def _create_windows(api: Api, n: int) -> None:
    for i in range(n):
        body = {"name": f"w{i}", "timezone": "UTC", "daily": [{"start": "22:00", "end": "06:00"}]}
        r = api.client.post("/api/v1/windows", json=body, headers=api.as_("admin"))
        assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    ("path", "user", "setup", "names"),
    [
        ("/api/v1/batches", "alice", lambda api: _create_batches(api, 3), ["b0", "b1", "b2"]),
        ("/api/v1/windows", "alice", lambda api: _create_windows(api, 3), ["w0", "w1", "w2"]),
        ("/api/v1/users", "admin", lambda api: None, ["admin", "alice", "bob"]),
        ("/api/v1/queues", "admin", lambda api: None, ["cv", "default", "ml"]),
        (
            "/api/v1/nodes",
            "alice",
            lambda api: [add_node(api.factory, n, gpus=1) for n in ("n1", "n2", "n3")],
            ["n1", "n2", "n3"],
        ),
    ],
)
def test_every_list_is_capped_with_a_count(
    api: Api, path: str, user: str, setup: Any, names: list[str]
) -> None:
    setup(api)
    key = {"/api/v1/queues": "project"}.get(path, "name")
    headers = api.as_(user)
    r = api.client.get(path, params={"limit": 2}, headers=headers)
    assert r.status_code == 200, r.text
    assert [item[key] for item in r.json()] == names[:2]
    assert r.headers["x-total-count"] == "3"
    r = api.client.get(path, params={"offset": 2}, headers=headers)
    assert [item[key] for item in r.json()] == names[2:]
    assert api.client.get(path, params={"limit": 5000}, headers=headers).status_code == 422
