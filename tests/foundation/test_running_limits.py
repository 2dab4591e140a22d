"""How many jobs a user, and a project, may run at once and how many GPUs they may use
(Slurm's MaxJobs / GrpJobs and MaxTRES / GrpTRES=gres/gpu): an admin sets them (API),
audited; a job over a limit is accepted and waits, its pending reason naming the limit
and the count. Real API and live cycles, both database backends."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cycle.jobs_api import add_node, get_job, run_one_cycle, submit


def _admin_patch(api: Any, path: str, body: dict[str, Any]) -> Any:
    r = api.client.patch(path, json=body, headers=api.as_("admin"))
    assert r.status_code == 200, r.text
    return r.json()


def _running(api: Any, ids: list[int]) -> list[int]:
    return [i for i in ids if get_job(api, i)["status"] != "PENDING"]


def test_an_admin_sets_and_clears_a_users_running_limits(api: Any) -> None:
    user = _admin_patch(api, "/api/v1/users/alice", {"max_running_jobs": 2, "max_gpus": 4})
    assert (user["max_running_jobs"], user["max_gpus"]) == (2, 4)
    listed = api.client.get("/api/v1/users", headers=api.as_("admin")).json()
    assert [(u["max_running_jobs"], u["max_gpus"]) for u in listed if u["name"] == "alice"] == [
        (2, 4)
    ]
    cleared = _admin_patch(api, "/api/v1/users/alice", {"max_gpus": None})
    assert (cleared["max_running_jobs"], cleared["max_gpus"]) == (2, None)
    events = api.client.get("/api/v1/audit", headers=api.as_("admin")).json()["items"]
    assert any(
        e["action"] == "user.limits" and e["target"] == "alice" and "max_gpus" in str(e)
        for e in events
    )
    own = api.client.patch(
        "/api/v1/users/alice", json={"max_running_jobs": 100}, headers=api.as_("alice")
    )
    assert own.status_code == 403


@pytest.mark.parametrize("path", ["/api/v1/users/alice", "/api/v1/projects/ml"])
@pytest.mark.parametrize("field", ["max_running_jobs", "max_gpus"])
def test_a_negative_limit_is_422_naming_the_field(api: Any, path: str, field: str) -> None:
    r = api.client.patch(path, json={field: -1}, headers=api.as_("admin"))
    assert r.status_code == 422, r.text
    assert field in r.text


def test_a_user_over_the_running_limit_waits_saying_so(api: Any) -> None:
    add_node(api, gpus=4)
    _admin_patch(api, "/api/v1/users/alice", {"max_running_jobs": 1})
    ids = [submit(api, gpus=1)["id"] for _ in range(3)]  # accepted, not refused
    other = submit(api, user="bob", gpus=1)["id"]
    run_one_cycle(api)
    assert _running(api, ids) == [ids[0]]
    assert get_job(api, other)["status"] != "PENDING"  # bob is not held back
    waiting = get_job(api, ids[1])
    assert waiting["pending_reason"] == "running_limit"
    assert waiting["pending_message"] == (
        "user alice may run 1 job at once (1 running; a limit an admin set)"
    )
    # Raised by an admin: the next cycle starts the rest.
    _admin_patch(api, "/api/v1/users/alice", {"max_running_jobs": None})
    run_one_cycle(api)
    assert _running(api, ids) == ids


def test_a_project_gpu_limit_counts_every_users_gpus(api: Any) -> None:
    add_node(api, gpus=4)
    api.add_user("carol", ["ml"])
    queue = _admin_patch(api, "/api/v1/projects/ml", {"max_gpus": 3})
    assert (queue["max_gpus"], queue["max_running_jobs"]) == (3, None)
    first = submit(api, gpus=2)["id"]
    second = submit(api, user="carol", gpus=2)["id"]
    run_one_cycle(api)
    assert get_job(api, first)["status"] != "PENDING"
    waiting = get_job(api, second)
    assert waiting["status"] == "PENDING"
    assert waiting["pending_reason"] == "running_limit"
    assert waiting["pending_message"] == (
        "project ml may use 3 GPUs at once (2 in use, this job needs 2; a limit an admin set)"
    )
