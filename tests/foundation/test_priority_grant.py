"""Priority is granted, not taken (Slurm: a user may only lower their job's priority, as
with nice; an admin raises it): above 0 a user's job needs an admin, or stays within the
maximum an admin set for its project (PATCH /api/v1/projects/{name} `max_priority`,
audited). A refusal is a 403 that says who can raise it."""

from __future__ import annotations

from typing import Any

JOBS = "/api/v1/jobs"


def _submit(api: Any, user: str = "alice", **body: Any) -> Any:
    return api.client.post(JOBS, json={"command": ["train"], **body}, headers=api.as_(user))


def _patch(api: Any, job: int, user: str = "alice", **body: Any) -> Any:
    return api.client.patch(f"{JOBS}/{job}", json=body, headers=api.as_(user))


def _set_max(api: Any, project: str, max_priority: int) -> Any:
    r = api.client.patch(
        f"/api/v1/projects/{project}",
        json={"max_priority": max_priority},
        headers=api.as_("admin"),
    )
    assert r.status_code == 200, r.text
    return r.json()


def _refused(r: Any) -> str:
    assert r.status_code == 403, r.text
    detail: str = r.json()["detail"]
    assert "only an admin" in detail and "gpusched quota ml --max-priority" in detail
    return detail


def test_a_user_may_lower_priority_but_not_raise_it(api: Any) -> None:
    detail = _refused(_submit(api, priority=1000))
    assert detail.startswith("priority 1000 is above 0, the maximum of project ml")
    _refused(_submit(api, priority=1, array={"indices": "0-3"}))
    assert _submit(api, priority=0).status_code == 201
    lowered = _submit(api, priority=-10)
    assert lowered.status_code == 201 and lowered.json()["priority"] == -10
    job = lowered.json()["id"]
    _refused(_patch(api, job, priority=1))
    back = _patch(api, job, priority=0)
    assert back.status_code == 200 and back.json()["priority"] == 0
    # Nothing was stored by the refusals.
    jobs = api.client.get(JOBS, headers=api.as_("alice")).json()["items"]
    assert sorted(j["priority"] for j in jobs) == [0, 0]


def test_an_admin_raises_and_the_owner_may_lower_from_there(api: Any) -> None:
    job = _submit(api).json()["id"]
    raised = _patch(api, job, user="admin", priority=500)
    assert raised.status_code == 200 and raised.json()["priority"] == 500
    # Lowering is always allowed, also to a value still above the project's maximum ...
    assert _patch(api, job, priority=400).json()["priority"] == 400
    # ... and other changes keep what the admin gave.
    assert _patch(api, job, name="renamed").status_code == 200
    # Raising again is the admin's.
    detail = _refused(_patch(api, job, priority=450))
    assert detail.startswith("priority 450 is above 400, what the job has")
    # An admin submits with any priority, into any project.
    assert _submit(api, user="admin", project="ml", priority=900).status_code == 201


def test_an_admin_sets_a_projects_maximum_and_the_audit_records_it(api: Any) -> None:
    assert _set_max(api, "ml", 100)["max_priority"] == 100
    assert _submit(api, priority=100).status_code == 201
    detail = _refused(_submit(api, priority=101))
    assert detail.startswith("priority 101 is above 100, the maximum of project ml")
    # Another project keeps its own (0).
    r = _submit(api, user="bob", priority=1)
    assert r.status_code == 403 and "project cv" in r.json()["detail"]
    # A bulk change is all or nothing: one raise beyond the maximum changes none.
    _submit(api, priority=5, labels={"exp": "1"})
    r = api.client.patch(
        JOBS, params={"label": "exp=1"}, json={"priority": 200}, headers=api.as_("alice")
    )
    assert r.status_code == 403
    r = api.client.patch(
        JOBS, params={"label": "exp=1"}, json={"priority": 50}, headers=api.as_("alice")
    )
    assert r.status_code == 200 and r.json()["count"] == 1
    [changed] = r.json()["ids"]
    assert api.client.get(f"{JOBS}/{changed}", headers=api.as_("alice")).json()["priority"] == 50

    _set_max(api, "ml", 0)
    events = api.client.get(
        "/api/v1/audit", params={"target": "ml"}, headers=api.as_("admin")
    ).json()["items"]
    assert [(e["actor"], e["action"], e["info"]) for e in events] == [
        ("admin", "project.update", {"max_priority": {"from": 100, "to": 0}}),
        ("admin", "project.update", {"max_priority": {"from": 0, "to": 100}}),
    ]
    queue = api.client.get("/api/v1/queues", headers=api.as_("alice")).json()
    assert [q["max_priority"] for q in queue] == [0]


def test_only_admins_set_a_maximum_and_bad_values_are_refused(api: Any) -> None:
    r = api.client.patch("/api/v1/projects/ml", json={"max_priority": 10}, headers=api.as_("alice"))
    assert r.status_code == 403
    for bad in (-1, 1001, "high", None):
        r = api.client.patch(
            "/api/v1/projects/ml", json={"max_priority": bad}, headers=api.as_("admin")
        )
        assert r.status_code == 422, (bad, r.text)


def test_a_batch_template_cannot_raise_priority(api: Any) -> None:
    """A batch's jobs are submitted as its owner: its templates are held to the same rule
    when the batch is made."""
    batch = {
        "name": "nightly",
        "cron": "0 2 * * *",
        "templates": [{"command": ["train"], "priority": 7}],
    }
    r = api.client.post("/api/v1/batches", json=batch, headers=api.as_("alice"))
    assert r.status_code == 403 and "maximum of project ml" in r.json()["detail"]
    _set_max(api, "ml", 7)
    r = api.client.post("/api/v1/batches", json=batch, headers=api.as_("alice"))
    assert r.status_code == 201, r.text
