"""Job arrays (sbatch --array): one submission makes a job per index; `max_running` (%N)
keeps all but N of them out of the queue."""

from __future__ import annotations

import pytest

from app.jobs.arrays import MAX_TASKS, parse_indices, split_slurm_form, throttle_message
from app.jobs.models import Job
from tests.cycle.jobs_api import add_node, finish, get_job, job_events, run_one_cycle, submit


@pytest.mark.parametrize(
    ("text", "indices"),
    [
        ("0-3", (0, 1, 2, 3)),
        ("5", (5,)),
        ("1,3,5-7", (1, 3, 5, 6, 7)),
        ("0-15:4", (0, 4, 8, 12)),
        # Overlapping parts name each index once, in order.
        ("3,0-3", (0, 1, 2, 3)),
        (" 1, 2 ", (1, 2)),
    ],
)
def test_parse_indices(text, indices):
    assert parse_indices(text) == indices


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "'' is not an index or a range"),
        ("a-b", "'a-b' is not an index or a range"),
        ("5-2", "range '5-2' ends before it starts"),
        ("0-9:0", "range '0-9:0': the step must be at least 1"),
        ("100000", "index 100000 is above the largest allowed, 99999"),
        (f"0-{MAX_TASKS}", f"more than {MAX_TASKS} tasks"),
        ("1,-2", "'-2' is not an index or a range"),
    ],
)
def test_parse_indices_refuses(text, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        parse_indices(text)


@pytest.mark.parametrize(
    ("text", "split"),
    [("0-9%2", ("0-9", 2)), ("0-9", ("0-9", None)), ("1,3%1", ("1,3", 1))],
)
def test_split_slurm_form(text, split):
    assert split_slurm_form(text) == split


def _tasks(api, array_id: int) -> list[dict]:
    r = api.client.get(
        "/api/v1/jobs", params={"array": array_id, "limit": 500}, headers=api.as_("admin")
    )
    assert r.status_code == 200, r.text
    return sorted(r.json()["items"], key=lambda j: j["array"]["index"])


def test_an_array_is_one_job_per_index_each_told_its_index(api):
    first = submit(api, name="sweep", array={"indices": "0-15:5"}, env={"LR": "1e-4"})
    assert first["array"] == {"id": first["id"], "index": 0, "tasks": 4, "max_running": None}
    tasks = _tasks(api, first["id"])
    assert [t["array"]["index"] for t in tasks] == [0, 5, 10, 15]
    assert {t["name"] for t in tasks} == {"sweep"}
    assert all(t["array"]["id"] == first["id"] for t in tasks)
    assert tasks[2]["env"] == {
        "LR": "1e-4",
        "GPUSCHED_ARRAY_JOB_ID": str(first["id"]),
        "GPUSCHED_ARRAY_TASK_ID": "10",
        "GPUSCHED_ARRAY_TASK_COUNT": "4",
    }
    # A job of its own is no array's task.
    assert submit(api)["array"] is None


def test_max_running_keeps_the_rest_of_the_array_out_of_the_queue(api):
    add_node(api, 8)  # room for every task: only the limit holds them back
    first = submit(api, name="sweep", array={"indices": "0-4", "max_running": 2})
    ids = [t["id"] for t in _tasks(api, first["id"])]

    run_one_cycle(api)
    statuses = [get_job(api, j)["status"] for j in ids]
    assert statuses == ["SCHEDULED", "SCHEDULED", "PENDING", "PENDING", "PENDING"]
    waiting = get_job(api, ids[2])
    assert (waiting["pending_reason"], waiting["pending_message"], waiting["queue_position"]) == (
        "array_limit",
        f"array {first['id']} runs at most 2 tasks at once: waiting for one of its tasks to end",
        None,
    )

    # One task ends: the next (by index) takes its slot in the same cycle.
    finish(api, ids[0])
    run_one_cycle(api)
    statuses = [get_job(api, j)["status"] for j in ids]
    assert statuses == ["SUCCEEDED", "SCHEDULED", "SCHEDULED", "PENDING", "PENDING"]

    # A failed task frees its slot too; the array goes on (each task is a job of its own).
    finish(api, ids[1], "FAILED")
    finish(api, ids[2])
    run_one_cycle(api)
    statuses = [get_job(api, j)["status"] for j in ids]
    assert statuses == ["SUCCEEDED", "FAILED", "SUCCEEDED", "SCHEDULED", "SCHEDULED"]


def test_a_held_task_gives_its_slot_to_the_next(api):
    add_node(api, 8)
    first = submit(api, name="sweep", array={"indices": "0-2", "max_running": 1})
    ids = [t["id"] for t in _tasks(api, first["id"])]
    assert api.client.post(f"/api/v1/jobs/{ids[0]}/hold", headers=api.as_("alice")).is_success
    run_one_cycle(api)
    assert [get_job(api, j)["status"] for j in ids] == ["PENDING", "SCHEDULED", "PENDING"]
    assert get_job(api, ids[0])["pending_reason"] == "held"
    assert get_job(api, ids[2])["pending_reason"] == "array_limit"


def test_depending_on_an_array_waits_for_every_task(api):
    add_node(api, 8)
    first = submit(api, name="sweep", array={"indices": "0-2"})
    ids = [t["id"] for t in _tasks(api, first["id"])]
    # The array's id names the whole array, as afterok:<array job id> does in Slurm.
    report = submit(api, name="report", depends_on=[first["id"]])
    assert report["depends_on"] == ids
    assert report["pending_message"] == f"waiting for job {ids[0]} (sweep[0]) and 2 more to succeed"
    run_one_cycle(api)
    finish(api, ids[0])
    finish(api, ids[1])
    run_one_cycle(api)
    assert get_job(api, report["id"])["pending_reason"] == "dependency"
    finish(api, ids[2])
    run_one_cycle(api)
    assert get_job(api, report["id"])["status"] == "SCHEDULED"


def test_an_idempotent_replay_returns_the_array_and_makes_no_second_one(api):
    body = {"command": ["train"], "array": {"indices": "0-3", "max_running": 2}}
    headers = {**api.as_("alice"), "Idempotency-Key": "sweep-1"}
    r1 = api.client.post("/api/v1/jobs", json=body, headers=headers)
    r2 = api.client.post("/api/v1/jobs", json=body, headers=headers)
    assert (r1.status_code, r2.status_code) == (201, 200)
    assert r2.json()["id"] == r1.json()["id"]
    assert r2.json()["array"] == r1.json()["array"]
    assert len(_tasks(api, r1.json()["id"])) == 4
    r3 = api.client.post(
        "/api/v1/jobs", json={**body, "array": {"indices": "0-4"}}, headers=headers
    )
    assert r3.status_code == 409


@pytest.mark.parametrize(
    ("array", "field", "message"),
    [
        ({"indices": "9-1"}, ["body", "array", "indices"], "range '9-1' ends before it starts"),
        ({"indices": "0-2000"}, ["body", "array", "indices"], f"more than {MAX_TASKS} tasks"),
        ({"indices": "0-3", "max_running": 0}, ["body", "array", "max_running"], "greater than"),
        ({"indices": ""}, ["body", "array", "indices"], "at least 1 character"),
    ],
)
def test_a_bad_array_is_refused_on_its_field(api, array, field, message):
    r = api.client.post(
        "/api/v1/jobs", json={"command": ["train"], "array": array}, headers=api.as_("alice")
    )
    assert r.status_code == 422, r.text
    errors = r.json()["errors"]
    assert errors[0]["loc"] == field
    assert message in errors[0]["msg"]
    with api.factory() as session:
        assert session.query(Job).count() == 0  # nothing half-made


def test_throttle_message():
    assert throttle_message(array_id=4, max_running=1) == (
        "array 4 runs at most 1 task at once: waiting for one of its tasks to end"
    )
    assert throttle_message(array_id=4, max_running=3).startswith("array 4 runs at most 3 tasks")


def _change_limit(api, job_id: int, max_running, user: str = "alice"):
    return api.client.patch(
        f"/api/v1/jobs/{job_id}/array", json={"max_running": max_running}, headers=api.as_(user)
    )


def test_the_limit_of_a_running_array_can_be_raised_lowered_or_lifted(api):
    add_node(api, 8)
    first = submit(api, name="sweep", array={"indices": "0-5", "max_running": 1})
    ids = [t["id"] for t in _tasks(api, first["id"])]
    run_one_cycle(api)
    assert [get_job(api, j)["status"] for j in ids].count("SCHEDULED") == 1

    # The cluster emptied overnight: let the sweep use more. Any task's id will do.
    r = _change_limit(api, ids[3], 3)
    assert r.status_code == 200, r.text
    assert r.json()["array"]["max_running"] == 3
    run_one_cycle(api)
    assert [get_job(api, j)["status"] for j in ids] == ["SCHEDULED"] * 3 + ["PENDING"] * 3
    events = job_events(api, first["id"])
    assert events[-1]["reason"] == "array limit changed by alice: 1 -> 3 at once"

    # Lowered: running tasks go on, nothing new starts until they are below it.
    assert _change_limit(api, ids[0], 2).status_code == 200
    finish(api, ids[0])
    run_one_cycle(api)
    statuses = [get_job(api, j)["status"] for j in ids]
    assert statuses == ["SUCCEEDED", "SCHEDULED", "SCHEDULED", "PENDING", "PENDING", "PENDING"]

    # Lifted: every task left joins the queue.
    assert _change_limit(api, ids[0], None).status_code == 200
    run_one_cycle(api)
    assert [get_job(api, j)["status"] for j in ids][3:] == ["SCHEDULED"] * 3


def test_changing_the_limit_of_a_job_of_its_own_is_refused(api):
    single = submit(api)["id"]
    r = _change_limit(api, single, 2)
    assert r.status_code == 409 and "not a task of a job array" in r.text
    first = submit(api, array={"indices": "0-1"})["id"]
    r = _change_limit(api, first, 0)
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "max_running"]
    r = api.client.patch(f"/api/v1/jobs/{first}/array", json={}, headers=api.as_("alice"))
    assert r.status_code == 422  # say what it should be: a number, or null for no limit
    assert _change_limit(api, first, 2, user="bob").status_code == 403  # not his project


def _cancel(api, as_user: str = "alice", **params):
    return api.client.post("/api/v1/jobs/cancel", params=params, headers=api.as_(as_user))


def test_an_array_is_cancelled_in_one_request_running_tasks_stopped(api):
    add_node(api, 2)
    first = submit(api, name="sweep", array={"indices": "0-4"})
    ids = [t["id"] for t in _tasks(api, first["id"])]
    run_one_cycle(api)
    finish(api, ids[0])  # task 0 ran and ended: it stays SUCCEEDED
    run_one_cycle(api)
    before = [get_job(api, j)["status"] for j in ids]
    assert before == ["SUCCEEDED", "SCHEDULED", "SCHEDULED", "PENDING", "PENDING"]
    assert submit(api)["id"]  # a job of alice's own, not of the array: left alone

    r = _cancel(api, array=first["id"], grace_s=0)
    assert r.status_code == 200, r.text
    # Counts and ids, not the jobs (issue 42: 20,000 of them were 20 MB).
    assert r.json() == {"count": 4, "ids": ids[1:], "more": 0, "stopping": 2}
    # Waiting tasks end at once; placed ones are asked to stop (their agents report it).
    acted = {j: get_job(api, j) for j in ids[1:]}
    assert [acted[j]["status"] for j in ids[1:]] == ["SCHEDULED"] * 2 + ["CANCELLED"] * 2
    assert all(acted[j]["cancel_requested"] for j in ids[1:3])
    stopping = job_events(api, ids[1])[-1]["reason"]
    assert stopping == "cancel requested; stopping the process (SIGKILL now)"
    assert get_job(api, ids[0])["status"] == "SUCCEEDED"
    pending = api.client.get("/api/v1/jobs", params={"status": "PENDING"}, headers=api.as_("alice"))
    assert len(pending.json()["items"]) == 1  # alice's own job

    # Idempotent: again, only the tasks still stopping are named.
    again = _cancel(api, array=first["id"])
    assert (again.json()["ids"], again.json()["stopping"]) == (ids[1:3], 2)


def test_a_bulk_cancel_takes_only_what_its_filters_and_the_callers_projects_select(api):
    sweep = submit(api, array={"indices": "0-1"}, labels={"run": "a"})["id"]
    other = submit(api, labels={"run": "b"})["id"]
    bobs = submit(api, user="bob")["id"]
    # Every filter must hold: alice's pending jobs labelled run=b.
    r = _cancel(api, user="alice", status="PENDING", label="run=b")
    assert r.status_code == 200, r.text
    assert r.json()["ids"] == [other]
    # Bob may not touch project ml: his cancel of "user alice" selects nothing of hers.
    assert _cancel(api, "bob", user="alice").json()["count"] == 0
    assert _cancel(api, "bob", project="ml").json()["count"] == 0
    assert [j["status"] for j in _tasks(api, sweep)] == ["PENDING", "PENDING"]
    # An admin's selection spans projects.
    r = _cancel(api, "admin", status="PENDING")
    assert r.json()["ids"] == sorted([sweep, sweep + 1, bobs])


def test_a_bulk_cancel_must_say_which_jobs(api):
    job = submit(api)["id"]
    r = _cancel(api)
    assert r.status_code == 422
    assert r.json()["errors"][0]["loc"] == ["query", "status"]
    assert "select the jobs to cancel" in r.json()["errors"][0]["msg"]
    r = _cancel(api, array=job, grace_s=-1)
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["query", "grace_s"]
    r = _cancel(api, label="run")
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["query", "label"]
    assert _cancel(api, array=job).json()["count"] == 0  # a job of its own is no array
    assert get_job(api, job)["status"] == "PENDING"


def test_depending_on_arrays_counts_their_tasks(api, monkeypatch):
    big = [submit(api, array={"indices": "0-599"})["id"] for _ in range(2)]
    r = api.client.post(
        "/api/v1/jobs", json={"command": ["report"], "depends_on": big}, headers=api.as_("alice")
    )
    assert r.status_code == 422
    assert r.json()["errors"][0]["msg"] == (
        f"names 1200 jobs, counting each array's tasks; at most {MAX_TASKS}"
    )
    # Loaded in chunks, so that no statement binds more ids than the database allows.
    import app.jobs.dependencies as dependencies

    monkeypatch.setattr(dependencies, "_LOAD_CHUNK", 7)
    report = submit(api, depends_on=[big[0]])
    with api.factory() as session:
        loaded = dependencies.load_dependencies(session, report["depends_on"])
    assert sorted(loaded) == report["depends_on"] and len(loaded) == 600


def test_a_bulk_cancel_of_many_jobs_answers_with_a_count_and_the_first_ids(api):
    """Not the jobs: a bulk cancel of 20,192 jobs answered 20.7 MB (issue 42)."""
    from app.jobs.schemas import BULK_IDS_SHOWN
    from tests.foundation.builders import insert_jobs

    many = insert_jobs(api.factory, user="alice", project="ml", count=BULK_IDS_SHOWN + 5)
    r = _cancel(api, user="alice")
    assert r.status_code == 200, r.text
    assert r.json() == {
        "count": BULK_IDS_SHOWN + 5, "ids": many[:BULK_IDS_SHOWN], "more": 5, "stopping": 0,
    }  # fmt: skip
    assert get_job(api, many[-1])["status"] == "CANCELLED"
