"""A job's environment (`--export ALL` copies the submitter's, cloud keys and all) is read
only by the job's owner and admins; the other members of its project see the variables'
names, their values null, wherever a job is shown."""

from __future__ import annotations

from typing import Any

SECRET = "AKIA-secret-value-7f3a"
ENV = {"AWS_SECRET_ACCESS_KEY": SECRET, "PATH": "/opt/conda/bin:/usr/bin"}
HIDDEN = {"AWS_SECRET_ACCESS_KEY": None, "PATH": None}


def _submit(api: Any, **body: Any) -> dict[str, Any]:
    body = {"command": ["train"], "env": ENV, "labels": {"exp": "1"}, **body}
    r = api.client.post("/api/v1/jobs", json=body, headers=api.as_("alice"))
    assert r.status_code == 201, r.text
    job: dict[str, Any] = r.json()
    assert body["env"].items() <= job["env"].items()  # its owner reads what was submitted
    return job


def test_only_the_owner_and_admins_read_a_jobs_environment(api: Any) -> None:
    api.add_user("dana", ["ml"])  # alice's colleague in project ml
    job = _submit(api)
    path = f"/api/v1/jobs/{job['id']}"
    for user, env in (("alice", ENV), ("admin", ENV), ("dana", HIDDEN)):
        headers = api.as_(user)
        assert api.client.get(path, headers=headers).json()["env"] == env, user
        listed = api.client.get("/api/v1/jobs", headers=headers).json()["items"]
        assert [j["env"] for j in listed] == [env], user
        queued = api.client.get("/api/v1/queue", headers=headers).json()["items"]
        assert [j["env"] for j in queued] == [env], user
    # Whatever a member does to the job answers with it: the values stay hidden.
    dana = api.as_("dana")
    for r in (
        api.client.post(f"{path}/hold", headers=dana),
        api.client.patch(path, json={"name": "renamed"}, headers=dana),
        api.client.post(f"{path}/cancel", headers=dana),
    ):
        assert r.status_code == 200, r.text
        assert SECRET not in r.text
        assert "AWS_SECRET_ACCESS_KEY" in r.text
    # A bulk action answers with counts and ids: no job, no environment at all.
    r = api.client.post("/api/v1/jobs/release", params={"label": "exp=1"}, headers=dana)
    assert r.status_code == 200 and "AWS_SECRET_ACCESS_KEY" not in r.text


def test_an_array_tasks_own_variables_are_hidden_too(api: Any) -> None:
    api.add_user("dana", ["ml"])
    array = _submit(api, array={"indices": "0-1"}, env={"TOKEN": SECRET})
    r = api.client.get("/api/v1/jobs", params={"array": array["id"]}, headers=api.as_("dana"))
    assert SECRET not in r.text
    assert all(set(j["env"].values()) == {None} for j in r.json()["items"])
    assert "GPUSCHED_ARRAY_TASK_ID" in r.json()["items"][0]["env"]


def test_a_batch_templates_environment_is_its_owners(api: Any) -> None:
    api.add_user("dana", ["ml"])
    batch = {
        "name": "nightly",
        "cron": "0 2 * * *",
        "templates": [{"command": ["train"], "env": {"TOKEN": SECRET}}],
    }
    r = api.client.post("/api/v1/batches", json=batch, headers=api.as_("alice"))
    assert r.status_code == 201 and r.json()["templates"][0]["env"] == {"TOKEN": SECRET}
    for user, env in (("alice", {"TOKEN": SECRET}), ("admin", {"TOKEN": SECRET})):
        r = api.client.get("/api/v1/batches/nightly", headers=api.as_(user))
        assert r.json()["templates"][0]["env"] == env
    for path in ("/api/v1/batches", "/api/v1/batches/nightly"):
        r = api.client.get(path, headers=api.as_("dana"))
        assert r.status_code == 200 and SECRET not in r.text and "TOKEN" in r.text
