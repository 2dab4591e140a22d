"""PATCH /jobs?array=12 (or ?user=, ?label=, ...): one change for every pending job the
filters select, as `scontrol update` of an array id changes all its pending tasks; all or
nothing."""

from __future__ import annotations

from typing import Any

from tests.cycle.jobs_api import (
    add_node,
    get_job,
    grant_priority,
    job_events,
    run_one_cycle,
    submit,
)


def _patch(api: Any, params: dict[str, Any], user: str = "alice", **body: Any) -> Any:
    return api.client.patch("/api/v1/jobs", params=params, json=body, headers=api.as_(user))


def test_an_arrays_pending_tasks_are_changed_and_its_placed_one_is_not(api):
    add_node(api, 1)
    grant_priority(api)
    prep = submit(api, name="prep", gpus=0, schedule={"mode": "at", "at": "2099-01-01T00:00:00Z"})
    array = submit(api, name="sweep", array={"indices": "0-2"})["id"]
    run_one_cycle(api)  # task 0 takes the GPU
    assert get_job(api, array)["status"] == "SCHEDULED"

    r = _patch(api, {"array": array}, priority=5, depends_on=[prep["id"]])
    assert r.status_code == 200, r.text
    assert r.json() == {"count": 2, "ids": [array + 1, array + 2], "more": 0, "stopping": 0}
    for job in (get_job(api, array + 1), get_job(api, array + 2)):
        assert (job["priority"], job["depends_on"], job["pending_reason"]) == (
            5,
            [prep["id"]],
            "dependency",
        )
        assert job_events(api, job["id"])[-1]["reason"] == (
            f"updated by alice: priority 0 -> 5, dependency none -> afterok:{prep['id']}"
        )
    placed = get_job(api, array)
    assert (placed["priority"], placed["depends_on"]) == (0, [])


def test_a_change_refused_for_one_job_changes_none_and_names_it(api):
    first = submit(api, name="a", labels={"exp": "7"})["id"]
    second = submit(api, name="b", labels={"exp": "7"})["id"]
    # Each is told to wait for the second: the second cannot wait for itself.
    r = _patch(api, {"label": "exp=7"}, priority=-3, depends_on=[second])
    assert r.status_code == 422, r.text
    assert r.json()["errors"] == [
        {
            "loc": ["body", "depends_on"],
            "field": "depends_on",
            "msg": f"job {second}: job {second} cannot wait for itself",
            "type": "value_error",
        }
    ]
    for job_id in (first, second):
        job = get_job(api, job_id)
        assert (job["priority"], job["depends_on"]) == (0, [])
        assert [e["reason"] for e in job_events(api, job_id)] == ["submitted"]


def test_a_selection_is_required_and_reaches_only_the_callers_pending_jobs(api):
    job = submit(api)["id"]
    r = _patch(api, {}, priority=1)
    assert r.status_code == 422
    assert r.json()["errors"][0]["loc"] == ["query", "status"]
    assert _patch(api, {"user": "alice"}, user="bob", priority=1).json()["count"] == 0
    assert get_job(api, job)["priority"] == 0
    r = _patch(api, {"user": "alice"}, priority=1001)
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "priority"]
    assert _patch(api, {"user": "alice"}, priority=-1).json()["ids"] == [job]
    assert get_job(api, job)["priority"] == -1
