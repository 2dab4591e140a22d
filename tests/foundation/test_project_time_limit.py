"""A project's longest time limit (PATCH /api/v1/projects/{name} `max_runtime_s`, as a
Slurm QOS's MaxWall): submissions, changes and batch templates of its jobs keep under it;
a job that sets none gets the cluster's default cut to it."""

from __future__ import annotations

from typing import Any

HOUR = 3600


def _set_limit(api: Any, project: str, max_runtime_s: int | None) -> Any:
    r = api.client.patch(
        f"/api/v1/projects/{project}",
        json={"max_runtime_s": max_runtime_s},
        headers=api.as_("admin"),
    )
    assert r.status_code == 200, r.text
    return r.json()


def _submit(api: Any, user: str = "alice", **body: Any) -> Any:
    return api.client.post(
        "/api/v1/jobs", json={"command": ["train"], **body}, headers=api.as_(user)
    )


def test_jobs_of_a_project_keep_under_its_longest_limit(api):
    assert _set_limit(api, "ml", 4 * HOUR)["max_runtime_s"] == 4 * HOUR
    refused = _submit(api, max_runtime_s=5 * HOUR)
    assert refused.status_code == 422
    [error] = refused.json()["errors"]
    assert error["loc"][-1] == "max_runtime_s"
    assert error["msg"] == (
        "18000 s (5h) is above the longest time limit of project ml, 14400 s (4h)"
    )
    # None asked: the project's longest (no cluster default here).
    job = _submit(api).json()
    assert job["max_runtime_s"] == 4 * HOUR
    # Another project of the cluster is not limited; an admin submitting into ml is.
    assert _submit(api, "bob", max_runtime_s=5 * HOUR).status_code == 201
    admin = _submit(api, "admin", project="ml", max_runtime_s=5 * HOUR)
    assert admin.status_code == 422 and "project ml" in admin.text

    # A change is checked as a submission is.
    r = api.client.patch(
        f"/api/v1/jobs/{job['id']}", json={"max_runtime_s": 5 * HOUR}, headers=api.as_("alice")
    )
    assert r.status_code == 422 and "longest time limit of project ml" in r.text

    # Cleared (null): the cluster's limits again.
    assert _set_limit(api, "ml", None)["max_runtime_s"] is None
    assert _submit(api, max_runtime_s=5 * HOUR).status_code == 201


def test_a_batch_template_beyond_its_projects_limit_is_refused(api):
    _set_limit(api, "ml", HOUR)
    r = api.client.post(
        "/api/v1/batches",
        json={
            "name": "nightly",
            "cron": "0 2 * * *",
            "templates": [{"command": ["train"], "max_runtime_s": 2 * HOUR}],
        },
        headers=api.as_("alice"),
    )
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["loc"][-3:] == ["templates", 0, "max_runtime_s"]
    assert "project ml" in r.json()["errors"][0]["msg"]


def test_the_audit_records_a_time_limit_and_bad_values_are_refused(api):
    _set_limit(api, "ml", 2 * HOUR)
    _set_limit(api, "ml", None)
    events = api.client.get(
        "/api/v1/audit?target=ml&action=project.update", headers=api.as_("admin")
    ).json()["items"]
    assert [e["info"] for e in events] == [
        {"max_runtime_s": {"from": 2 * HOUR, "to": None}},
        {"max_runtime_s": {"from": None, "to": 2 * HOUR}},
    ]
    for bad in (0, -5, "4h"):
        r = api.client.patch(
            "/api/v1/projects/ml", json={"max_runtime_s": bad}, headers=api.as_("admin")
        )
        assert r.status_code == 422 and r.json()["errors"][0]["loc"][-1] == "max_runtime_s"
    r = api.client.patch("/api/v1/projects/ml", json={}, headers=api.as_("admin"))
    assert r.status_code == 422 and "max_runtime_s" in r.text
