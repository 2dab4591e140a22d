"""A job's choice of nodes over the API and in live cycles: `only_nodes` (any of them)
and `exclude_nodes` (sbatch --exclude)."""

from __future__ import annotations

from typing import Any

from app.db import utcnow
from tests.cycle.jobs_api import get_job, run_one_cycle, submit
from tests.foundation.builders import ready_node


def _nodes(api: Any) -> None:
    with api.factory.begin() as session:  # best fit puts a 1-GPU job on n1
        session.add(ready_node("n1", gpus=1, now=utcnow()))
        session.add(ready_node("n2", gpus=4, now=utcnow()))


def _placed_on(api: Any, job_id: int) -> list[str]:
    return sorted({a["node"] for a in get_job(api, job_id)["allocations"]})


def test_jobs_run_where_they_chose(api):
    _nodes(api)
    only = submit(api, only_nodes=["n2", "n2"])
    assert (only["only_nodes"], only["exclude_nodes"]) == (["n2"], [])
    away = submit(api, exclude_nodes=["n1"])
    plain = submit(api)
    run_one_cycle(api)
    assert _placed_on(api, only["id"]) == ["n2"]
    assert _placed_on(api, away["id"]) == ["n2"]
    assert _placed_on(api, plain["id"]) == ["n1"]


def test_a_choice_that_could_never_run_is_refused_naming_the_field(api):
    _nodes(api)
    for body, field, message in [
        ({"only_nodes": ["n9"]}, "only_nodes", "no node named n9; nodes: n1, n2"),
        ({"exclude_nodes": ["n1", "x"]}, "exclude_nodes", "no node named x; nodes: n1, n2"),
        (
            {"only_nodes": ["n1"], "gpus": 2},
            "only_nodes",
            "1 node(s) with 2 matching GPUs each requested; of the nodes it may use, none "
            "could ever fit",
        ),
        (
            {"exclude_nodes": ["n2"], "nodes": 2},
            "exclude_nodes",
            "2 node(s) with 1 matching GPUs each requested; of the nodes it may use, only n1 "
            "could ever fit",
        ),
        ({"only_nodes": []}, "only_nodes", "at least 1 item"),
    ]:
        r = api.client.post(
            "/api/v1/jobs", json={"command": ["t"], **body}, headers=api.as_("alice")
        )
        assert r.status_code == 422, (body, r.text)
        (error,) = r.json()["errors"]
        assert error["loc"] == ["body", field] and message in error["msg"], (body, error)


def test_a_pending_jobs_choice_is_changed_and_its_wait_explained(api):
    _nodes(api)
    big = submit(api, gpus=4)["id"]
    run_one_cycle(api)
    assert _placed_on(api, big) == ["n2"]
    job = submit(api, hold=True)["id"]
    r = api.client.patch(
        f"/api/v1/jobs/{job}", json={"exclude_nodes": ["n1"]}, headers=api.as_("alice")
    )
    assert r.status_code == 200, r.text
    api.client.post(f"/api/v1/jobs/{job}/release", headers=api.as_("alice"))
    run_one_cycle(api)
    waiting = get_job(api, job)
    assert (waiting["status"], waiting["exclude_nodes"]) == ("PENDING", ["n1"])
    assert waiting["pending_message"].endswith(" (it excludes n1)"), waiting["pending_message"]
    # Cleared (null: none excluded): the next cycle places it on n1.
    r = api.client.patch(
        f"/api/v1/jobs/{job}", json={"exclude_nodes": None}, headers=api.as_("alice")
    )
    assert r.status_code == 200 and r.json()["exclude_nodes"] == []
    run_one_cycle(api)
    assert _placed_on(api, job) == ["n1"]
