"""`?name=` selects jobs by name, as `squeue --name` and `scancel --name`: in the listing
and in every bulk action, only among the caller's jobs."""

from __future__ import annotations

from tests.cycle.jobs_api import get_job, submit


def test_jobs_of_a_name_are_listed_held_and_cancelled_by_it(api):
    nightly = [submit(api, name="nightly")["id"] for _ in range(2)]
    other = submit(api, name="nightly-eval")["id"]  # a name, not a prefix
    bobs = submit(api, user="bob", name="nightly")["id"]
    alice = api.as_("alice")

    listed = api.client.get("/api/v1/jobs", params={"name": "nightly"}, headers=alice).json()
    assert sorted(j["id"] for j in listed["items"]) == nightly  # not bob's: not her project
    held = api.client.post("/api/v1/jobs/hold", params={"name": "nightly"}, headers=alice)
    assert held.json()["ids"] == nightly
    cancelled = api.client.post("/api/v1/jobs/cancel", params={"name": "nightly"}, headers=alice)
    assert cancelled.json()["ids"] == nightly
    assert [get_job(api, j)["status"] for j in (other, bobs)] == ["PENDING", "PENDING"]
    r = api.client.get("/api/v1/jobs", params={"name": ""}, headers=alice)
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["query", "name"]


def test_the_queue_is_filtered_as_squeue_by_user_name_and_label(api):
    """GET /queue takes the filters of GET /jobs; positions stay the cluster's."""
    api.add_user("carol", ["ml"])
    first = submit(api, name="nightly", labels={"team": "nlp"})["id"]
    submit(api, name="eval")
    carols = submit(api, user="carol", name="nightly")["id"]
    admin = api.as_("admin")

    def queued(**params) -> list[int]:
        r = api.client.get("/api/v1/queue", params=params, headers=admin)
        assert r.status_code == 200, r.text
        assert r.json()["total"] == len(r.json()["items"])
        return [j["id"] for j in r.json()["items"]]

    assert queued(name="nightly") == [first, carols]
    assert queued(name="nightly", user="carol") == [carols]
    assert queued(label="team=nlp") == [first]
    assert queued(project="cv") == []
    # Bob sees only his project's queue, whatever he asks for.
    r = api.client.get("/api/v1/queue", params={"user": "alice"}, headers=api.as_("bob"))
    assert r.json()["items"] == []
    r = api.client.get("/api/v1/queue", params={"label": "team"}, headers=admin)
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["query", "label"]
