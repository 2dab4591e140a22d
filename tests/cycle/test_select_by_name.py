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
    assert sorted(j["id"] for j in held.json()) == nightly
    cancelled = api.client.post("/api/v1/jobs/cancel", params={"name": "nightly"}, headers=alice)
    assert sorted(j["id"] for j in cancelled.json()) == nightly
    assert [get_job(api, j)["status"] for j in (other, bobs)] == ["PENDING", "PENDING"]
    r = api.client.get("/api/v1/jobs", params={"name": ""}, headers=alice)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "name"]
