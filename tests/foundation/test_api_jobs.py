"""Contract tests for /api/v1/jobs: fields, validation, never-fits, idempotency, paging, cancel."""

from __future__ import annotations

import threading

import httpx
import pytest
from sqlalchemy import event

from app.jobs.states import JobStatus
from tests.foundation.builders import add_node, move_job

JOBS = "/api/v1/jobs"


def submit(api, user="alice", **body):
    body.setdefault("command", ["python", "train.py"])
    return api.client.post(JOBS, json=body, headers=api.as_(user))


def field_errors(response):
    return {tuple(err["loc"][1:]): err["msg"] for err in response.json()["errors"]}


def test_submit_returns_the_stored_job(api):
    r = submit(
        api,
        name="bert",
        gpus=2,
        gpu_memory_mb=40000,
        priority=-5,
        env={"LR": "0.1"},
        labels={"team": "nlp"},
        retries=2,
        preemptible=True,
        estimated_runtime_s=600,
        max_runtime_s=3600,
        schedule={"mode": "at", "at": "2030-01-01T02:00:00+01:00"},
    )
    assert r.status_code == 201, r.text
    job = r.json()
    assert r.headers["location"] == f"{JOBS}/{job['id']}"
    assert job["status"] == "PENDING" and job["user"] == "alice" and job["project"] == "ml"
    assert job["gpus"] == 2 and job["gpu_memory_mb"] == 40000 and job["env"] == {"LR": "0.1"}
    assert job["schedule"]["mode"] == "at"
    assert job["schedule"]["at"].startswith("2030-01-01T01:00:00")  # stored in UTC
    assert job["pending_message"]
    again = api.client.get(f"{JOBS}/{job['id']}", headers=api.as_("alice")).json()
    assert again == job


def test_shell_command_and_shared_gpu(api):
    job = submit(api, command="echo $HOME | wc -c", gpu_share=0.25).json()
    assert (
        job["command"] == "echo $HOME | wc -c"
        and job["gpu_share"] == 0.25
        and job["name"] == "echo"
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"gpus": -1}, ("gpus",)),
        ({"gpu_share": 1.5}, ("gpu_share",)),
        ({"gpu_share": 0}, ("gpu_share",)),
        ({"command": []}, ("command",)),
        ({"command": "   "}, ("command",)),
        ({"workdir": "relative/dir"}, ("workdir",)),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, ("env",)),
        ({"env": {"1BAD": "x"}}, ("env",)),
        ({"labels": {"bad key!": "x"}}, ("labels",)),
        ({"priority": 5000}, ("priority",)),
        ({"max_runtime_s": 0}, ("max_runtime_s",)),
        ({"retries": -1}, ("retries",)),
        ({"frobnicate": True}, ("frobnicate",)),
        ({"gpus": True}, ("gpus",)),  # lax pydantic read true as 1 GPU
        ({"gpu_share": False}, ("gpu_share",)),
        ({"estimated_runtime_s": True}, ("estimated_runtime_s",)),
        ({"schedule": {"mode": "at"}}, ("schedule",)),
        ({"schedule": {"mode": "at", "at": "2030-01-01T02:00:00"}}, ("schedule",)),
        ({"schedule": {"mode": "soon"}}, ("schedule", "mode")),
        ({"schedule": {"mode": "now", "window": "night"}}, ("schedule",)),
    ],
)
def test_bad_input_names_the_field(api, body, field):
    r = submit(api, **body)
    assert r.status_code == 422, r.text
    errors = field_errors(r)
    assert any(loc[: len(field)] == field for loc in errors), errors
    assert all(msg for msg in errors.values())


def test_true_for_a_count_says_a_number_is_needed(api):
    r = submit(api, gpus=True)
    assert r.status_code == 422
    assert field_errors(r)[("gpus",)] == "Value error, must be a number, not true or false"


def test_share_below_one_needs_a_single_gpu(api):
    r = submit(api, gpus=2, gpu_share=0.5)
    assert r.status_code == 422
    assert "gpu_share below 1 needs gpus = 1" in r.text


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("", "shell command must not be blank"),
        ("  ", "shell command must not be blank"),
        ([], "argv list must not be empty"),
        ([""], "program (argv[0]) must not be empty"),
        ("x" * 65537, "shell command longer than 65536 characters"),
        (["train", "y" * 8193], "argv[1] longer than 8192 characters"),
        (["train"] * 4097, "at most 4096 arguments"),
        (["train", 5], "argv[1] must be a string"),
        (5, "must be an argv list of strings or one shell command string"),
        ({"argv": ["train"]}, "must be an argv list of strings or one shell command string"),
    ],
)
def test_a_bad_command_is_refused_with_one_reason(api, command, why):
    r = submit(api, command=command)
    assert r.status_code == 422
    assert field_errors(r) == {("command",): f"Value error, {why}"}


def test_malformed_json_is_422_not_500(api):
    r = api.client.post(
        JOBS, content=b"{not json", headers={**api.as_("alice"), "content-type": "application/json"}
    )
    assert r.status_code == 422


def test_oversized_body_is_413(api):
    r = submit(
        api, command=["x"], env={"BIG": "y" * 30000} | {f"V{i}": "z" * 30000 for i in range(40)}
    )
    assert r.status_code == 413
    assert "Too Large" in r.text


def test_oversized_streamed_body_is_413(api):
    def chunks():
        yield b'{"command": ["x"], "name": "'
        for _ in range(200):
            yield b"a" * 10_000
        yield b'"}'

    r = api.client.post(
        JOBS, content=chunks(), headers={**api.as_("alice"), "content-type": "application/json"}
    )
    assert r.status_code == 413


def test_huge_ids_are_422_not_500(api):
    assert (
        api.client.get(f"{JOBS}/99999999999999999999", headers=api.as_("alice")).status_code == 422
    )
    bad_cursor = api.client.get(f"{JOBS}?cursor=99999999999999999", headers=api.as_("alice"))
    assert bad_cursor.status_code == 422
    assert bad_cursor.json()["errors"][0]["loc"] == ["query", "cursor"]  # not "body"
    assert api.client.get(f"{JOBS}/424242", headers=api.as_("alice")).status_code == 404


def test_accepted_while_no_node_is_registered(api):
    r = submit(api, gpus=64, gpu_memory_mb=10_000_000)
    assert r.status_code == 201


def test_never_fitting_request_names_the_largest_node(api):
    add_node(api.factory, "small", gpus=2)
    add_node(api.factory, "big", gpus=8)
    r = submit(api, gpus=9)
    assert r.status_code == 422
    assert (
        field_errors(r)[("gpus",)] == "no node could ever fit 9 GPUs: the largest node, big, has 8"
    )
    # gpus counts per node (Slurm's --gpus counts in all): the message says how to spread it.
    add_node(api.factory, "big2", gpus=8)
    assert field_errors(submit(api, gpus=16))[("gpus",)] == (
        "no node could ever fit 16 GPUs: the largest node, big2, has 8; gpus counts per "
        "node: 2 nodes with 8 GPUs each would (nodes=2, gpus=8)"
    )
    assert "gpus counts per node" not in field_errors(submit(api, gpus=17))[("gpus",)]
    r = submit(api, gpus=1, gpu_memory_mb=100_000)
    assert r.status_code == 422 and "largest has 81559 MiB" in field_errors(r)[("gpu_memory_mb",)]
    r = submit(api, gpus=4, nodes=4)
    assert r.status_code == 422 and "only 2 node(s)" in field_errors(r)[("nodes",)]
    r = submit(api, gpu_model="A100-40GB")
    assert r.status_code == 422 and "available: H100-80GB" in field_errors(r)[("gpu_model",)]
    assert submit(api, gpus=8, gpu_memory_mb=80_000).status_code == 201


def test_a_gpu_model_named_as_slurm_users_do(api):
    # Slurm's GRES types are short names (--gres=gpu:h100:2); NVML reports a product name.
    add_node(api.factory, "h", gpus=4, model="NVIDIA H100 80GB HBM3")
    add_node(api.factory, "a40", gpus=4, model="NVIDIA A100-SXM4-40GB", memory_mb=40960)
    add_node(api.factory, "a80", gpus=4, model="NVIDIA A100-SXM4-80GB")
    for asked in ("h100", "H100", "h100-80gb", "NVIDIA H100 80GB HBM3"):
        r = submit(api, gpus=2, gpu_model=asked)
        assert r.status_code == 201, r.text
        assert r.json()["gpu_model"] == "NVIDIA H100 80GB HBM3"  # stored as the cluster's
    assert submit(api, gpu_model="a100 sxm4 40gb").json()["gpu_model"] == "NVIDIA A100-SXM4-40GB"
    # Whole words only, and one model: no guessing.
    assert field_errors(submit(api, gpu_model="a100"))[("gpu_model",)] == (
        "'a100' could be NVIDIA A100-SXM4-40GB or NVIDIA A100-SXM4-80GB: name one"
    )
    assert (
        "no node has GPU model 'h10'" in field_errors(submit(api, gpu_model="h10"))[("gpu_model",)]
    )


def test_inventory_is_read_once_and_a_refusal_always_against_the_database(api):
    # Every submission checks the cluster's GPUs: a copy serves while it says "fits"; a
    # refusal is checked against a fresh read, so a node registered since is never missed.
    engine = api.factory.kw["bind"]
    reads = []

    def count(_conn, _cursor, statement, *_):
        if "FROM node LEFT OUTER JOIN gpu" in statement:
            reads.append(statement)

    add_node(api.factory, "small", gpus=2)
    event.listen(engine, "before_cursor_execute", count)
    try:
        assert submit(api, gpus=1).status_code == 201
        assert submit(api, gpus=2).status_code == 201
        assert len(reads) == 1  # the second used the copy
        add_node(api.factory, "big", gpus=8)
        assert submit(api, gpus=8).status_code == 201  # the copy said no; the database yes
        assert len(reads) == 2
        r = submit(api, gpus=9)
        assert r.status_code == 422 and "the largest node, big, has 8" in field_errors(r)[("gpus",)]
    finally:
        event.remove(engine, "before_cursor_execute", count)


def test_project_must_be_one_of_the_users(api):
    assert submit(api, project="cv").status_code == 422
    assert submit(api, project="nope").status_code == 422
    api.add_user("carol", ["ml", "cv"])
    r = submit(api, user="carol")
    assert r.status_code == 422 and "cv, ml" in field_errors(r)[("project",)]
    assert submit(api, user="carol", project="cv").json()["project"] == "cv"


def test_idempotency_key_returns_the_same_job(api):
    headers = {**api.as_("alice"), "Idempotency-Key": "nightly-42"}
    body = {"command": ["train"], "gpus": 1}
    first = api.client.post(JOBS, json=body, headers=headers)
    second = api.client.post(JOBS, json=body, headers=headers)
    assert first.status_code == 201 and second.status_code == 200
    assert first.json()["id"] == second.json()["id"]
    conflict = api.client.post(JOBS, json={**body, "gpus": 2}, headers=headers)
    assert conflict.status_code == 409 and "different body" in conflict.json()["detail"]
    # Keys are per user: bob's identical key is his own job.
    bob = api.client.post(
        JOBS, json=body, headers={**api.as_("bob"), "Idempotency-Key": "nightly-42"}
    )
    assert bob.status_code == 201 and bob.json()["id"] != first.json()["id"]


def test_concurrent_identical_requests_create_exactly_one_job(api):
    headers = {**api.as_("alice"), "Idempotency-Key": "race"}
    results: list[httpx.Response] = []
    barrier = threading.Barrier(8)

    def post():
        barrier.wait()
        results.append(api.client.post(JOBS, json={"command": ["x"]}, headers=headers))

    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status_code for r in results).count(201) == 1
    assert {r.status_code for r in results} <= {200, 201}
    assert len({r.json()["id"] for r in results}) == 1
    listed = api.client.get(JOBS, headers=api.as_("alice")).json()["items"]
    assert len(listed) == 1


def test_list_filters_and_newest_first(api):
    a = submit(api, labels={"team": "nlp"}).json()["id"]
    b = submit(api, labels={"team": "vision"}).json()["id"]
    c = submit(api, user="bob").json()["id"]
    move_job(api.factory, b, JobStatus.CANCELLED)

    def ids(query, user="admin"):
        r = api.client.get(f"{JOBS}{query}", headers=api.as_(user))
        assert r.status_code == 200, r.text
        return [j["id"] for j in r.json()["items"]]

    assert ids("") == [c, b, a]
    assert ids("", user="alice") == [b, a]  # alice cannot see bob's project
    assert ids("?status=PENDING") == [c, a]
    assert ids("?status=PENDING&status=CANCELLED&project=ml") == [b, a]
    assert ids("?user=bob") == [c]
    assert ids("?label=team=nlp") == [a]
    bad_label = api.client.get(f"{JOBS}?label=oops", headers=api.as_("admin"))
    assert bad_label.status_code == 422
    assert bad_label.json()["errors"][0]["loc"] == ["query", "label"]
    assert api.client.get(f"{JOBS}?status=DONE", headers=api.as_("admin")).status_code == 422


def test_pagination_stays_correct_while_jobs_are_added(api):
    first_ids = [submit(api).json()["id"] for _ in range(7)]
    seen: list[int] = []
    cursor = None
    pages = 0
    while True:
        query = "?limit=3" + (f"&cursor={cursor}" if cursor else "")
        page = api.client.get(f"{JOBS}{query}", headers=api.as_("alice")).json()
        seen += [j["id"] for j in page["items"]]
        pages += 1
        # New submissions between pages must neither repeat nor push jobs off the walk.
        submit(api)
        submit(api)
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(first_ids, reverse=True)
    assert pages == 3


def test_events_and_cancel_of_a_pending_job(api):
    job_id = submit(api).json()["id"]
    r = api.client.post(f"{JOBS}/{job_id}/cancel", headers=api.as_("alice"))
    assert r.status_code == 200 and r.json()["status"] == "CANCELLED"
    # No longer waiting: no "waiting for the next scheduling cycle" left on it.
    waiting_fields = ("pending_reason", "pending_message", "pending_until", "queue_position",
                      "estimated_start_at")  # fmt: skip
    assert [r.json()[key] for key in waiting_fields] == [None] * 5
    again = api.client.post(f"{JOBS}/{job_id}/cancel", headers=api.as_("alice"))
    assert again.status_code == 200 and again.json()["status"] == "CANCELLED"
    events = api.client.get(f"{JOBS}/{job_id}/events", headers=api.as_("alice")).json()
    assert [(e["from_status"], e["to_status"], e["actor"]) for e in events] == [
        (None, "PENDING", "alice"),
        ("PENDING", "CANCELLED", "alice"),
    ]


def test_cancel_of_a_running_job_asks_the_agent(api):
    job_id = submit(api).json()["id"]
    move_job(api.factory, job_id, JobStatus.SCHEDULED, JobStatus.RUNNING)
    r = api.client.post(f"{JOBS}/{job_id}/cancel", headers=api.as_("alice"))
    assert r.status_code == 200
    assert r.json()["status"] == "RUNNING" and r.json()["cancel_requested"] is True


def test_cancel_of_a_finished_job_is_a_conflict(api):
    job_id = submit(api).json()["id"]
    move_job(api.factory, job_id, JobStatus.SCHEDULED, JobStatus.RUNNING, JobStatus.SUCCEEDED)
    r = api.client.post(f"{JOBS}/{job_id}/cancel", headers=api.as_("alice"))
    assert r.status_code == 409 and "SUCCEEDED" in r.json()["detail"]
