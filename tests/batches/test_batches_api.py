"""REST: CRUD, validation locations, ownership and visibility."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from app.batches import service
from app.batches.models import BatchSchedule
from app.db import utcnow
from app.jobs.limits import RuntimeLimits
from tests.conftest import Api
from tests.foundation.builders import add_node

BATCHES = "/api/v1/batches"


def body(**fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": "nightly",
        "cron": "0 2 * * *",
        "timezone": "America/New_York",
        "templates": [{"command": ["python", "train.py"], "gpus": 1}],
    }
    out.update(fields)
    return out


def create(api: Api, user: str = "alice", **fields: Any) -> dict[str, Any]:
    r = api.client.post(BATCHES, json=body(**fields), headers=api.as_(user))
    assert r.status_code == 201, r.text
    result: dict[str, Any] = r.json()
    return result


def locs(response: Any) -> list[list[Any]]:
    assert response.status_code == 422, response.text
    return [e["loc"] for e in response.json()["errors"]]


def test_create_shows_next_fire_time_in_the_zone_and_stores_the_project(api: Api) -> None:
    b = create(api)
    assert b["owner"] == "alice" and b["project"] == "ml" and b["enabled"] is True
    assert b["target"] == "now" and b["catch_up"] == "once" and b["last_fired_at"] is None
    assert b["concurrency"] == "allow"  # as before the policy existed: firings overlap
    nxt = datetime.fromisoformat(b["next_fire_at"])
    assert b["next_fire_at"].endswith(("-05:00", "-04:00"))
    assert (nxt.hour, nxt.minute) == (2, 0) and nxt > utcnow()
    assert b["templates"] == [{"command": ["python", "train.py"], "gpus": 1, "project": "ml"}]
    listed = api.client.get(BATCHES, headers=api.as_("alice")).json()
    assert [x["name"] for x in listed] == ["nightly"]
    assert listed[0]["next_fire_at"] == b["next_fire_at"]


def test_duplicate_name_is_409(api: Api) -> None:
    create(api)
    r = api.client.post(BATCHES, json=body(), headers=api.as_("bob"))
    assert r.status_code == 409


def test_validation_errors_name_the_field(api: Api) -> None:
    h = api.as_("alice")
    cases = [
        (body(cron="61 * * * *"), ["body", "cron"]),
        (body(cron="0 2 * * * *"), ["body", "cron"]),
        (body(timezone="Mars/Olympus"), ["body", "timezone"]),
        (body(name="Not A Slug"), ["body", "name"]),
        (body(templates=[]), ["body", "templates"]),
        (body(templates=[{"command": ["x"], "gpus": -1}]), ["body", "templates", 0, "gpus"]),
        (body(templates=[{"command": ["x"], "gpus": True}]), ["body", "templates", 0, "gpus"]),
        (
            body(templates=[{"command": ["x"]}, {"command": []}]),
            ["body", "templates", 1, "command"],
        ),
        (
            body(templates=[{"command": ["x"], "schedule": {"mode": "offpeak"}}]),
            ["body", "templates", 0, "schedule"],
        ),
        (
            body(templates=[{"command": ["x"], "project": "cv"}]),
            ["body", "templates", 0, "project"],
        ),
        (body(window="night"), ["body", "window"]),
        (body(target="offpeak", window="night"), ["body", "window"]),  # no such window
        (body(target="later"), ["body", "target"]),
        (body(catch_up="all"), ["body", "catch_up"]),
        (body(concurrency="queue"), ["body", "concurrency"]),
        (  # refused when the batch is made, not at each firing
            body(
                templates=[
                    {"command": ["x"], "dependency": "singleton", "array": {"indices": "0-1"}}
                ]
            ),
            ["body", "templates", 0, "dependency"],
        ),
    ]
    for payload, loc in cases:
        r = api.client.post(BATCHES, json=payload, headers=h)
        assert loc in locs(r), (payload, r.json())
    assert api.client.get(BATCHES, headers=h).json() == []


def test_template_that_no_node_can_fit_is_rejected_in_place(api: Api) -> None:
    add_node(api.factory, "n1", gpus=4)
    r = api.client.post(
        BATCHES,
        json=body(templates=[{"command": ["x"], "gpus": 2}, {"command": ["y"], "gpus": 8}]),
        headers=api.as_("alice"),
    )
    assert locs(r) == [["body", "templates", 1, "gpus"]]
    assert "largest node" in r.json()["errors"][0]["msg"]


def test_template_whose_model_fits_no_gpu_is_rejected_when_the_batch_is_made(api: Api) -> None:
    # A submission derives its memory from `model` before checking it fits; the batch's
    # templates go through the same check, so no firing would fail on it later.
    add_node(api.factory, "n1", gpus=4)
    big = {"parameters": 70_000_000_000, "precision": "fp32"}
    r = api.client.post(
        BATCHES,
        json=body(templates=[{"command": ["x"], "gpus": 1, "model": big}]),
        headers=api.as_("alice"),
    )
    assert locs(r) == [["body", "templates", 0, "model"]]
    assert "no registered GPU model has that much" in r.json()["errors"][0]["msg"]


def test_a_template_waits_only_for_an_earlier_template(api: Api) -> None:
    h = api.as_("alice")
    steps = [{"command": ["prep"]}, {"command": ["train"], "after": [1]}]
    r = api.client.post(BATCHES, json=body(templates=steps), headers=h)
    assert locs(r) == [["body", "templates", 1, "after"]]
    assert r.json()["errors"][0]["msg"] == (
        "template 1 is not an earlier one: template 1 may wait for template 0"
    )
    first = [{"command": ["prep"], "after": [0]}]
    r = api.client.post(BATCHES, json=body(templates=first), headers=h)
    assert r.json()["errors"][0]["msg"] == (
        "template 0 is not an earlier one: the first template cannot wait for another"
    )
    # A fixed job id makes no sense in a template that fires every night.
    fixed = [{"command": ["prep"], "depends_on": [1]}]
    r = api.client.post(BATCHES, json=body(templates=fixed), headers=h)
    assert locs(r) == [["body", "templates", 0, "depends_on"]]
    assert "use 'after'" in r.json()["errors"][0]["msg"]


def test_user_in_several_projects_must_name_one(api: Api) -> None:
    api.add_user("dora", ["ml", "cv"])
    r = api.client.post(BATCHES, json=body(), headers=api.as_("dora"))
    assert locs(r) == [["body", "templates", 0, "project"]]
    b = create(api, "dora", templates=[{"command": ["x"], "project": "cv"}])
    assert b["project"] == "cv"


def test_unauthenticated_is_401(api: Api) -> None:
    create(api)
    assert api.client.get(BATCHES).status_code == 401
    assert api.client.post(BATCHES, json=body(name="x")).status_code == 401
    assert api.client.get(f"{BATCHES}/nightly").status_code == 401
    assert api.client.post(f"{BATCHES}/nightly/disable").status_code == 401
    bad = {"Authorization": "Bearer gps_nope"}
    assert api.client.get(BATCHES, headers=bad).status_code == 401


def test_other_projects_user_cannot_see_or_touch_it(api: Api) -> None:
    create(api)
    h = api.as_("bob")
    assert api.client.get(BATCHES, headers=h).json() == []
    assert api.client.get(f"{BATCHES}/nightly", headers=h).status_code == 404
    assert api.client.get(f"{BATCHES}/nightly/firings", headers=h).status_code == 404
    assert api.client.post(f"{BATCHES}/nightly/disable", headers=h).status_code == 404
    assert api.client.put(f"{BATCHES}/nightly", json=body(), headers=h).status_code == 404
    assert api.client.delete(f"{BATCHES}/nightly", headers=h).status_code == 404
    assert api.client.get(f"{BATCHES}/nightly", headers=api.as_("alice")).status_code == 200


def test_project_member_may_read_but_not_change_it(api: Api) -> None:
    create(api)
    api.add_user("carol", ["ml"])
    h = api.as_("carol")
    assert [b["name"] for b in api.client.get(BATCHES, headers=h).json()] == ["nightly"]
    assert api.client.get(f"{BATCHES}/nightly", headers=h).status_code == 200
    assert api.client.post(f"{BATCHES}/nightly/disable", headers=h).status_code == 403
    assert api.client.delete(f"{BATCHES}/nightly", headers=h).status_code == 403


def test_admin_sees_and_manages_all(api: Api) -> None:
    create(api)
    h = api.as_("admin")
    assert [b["owner"] for b in api.client.get(BATCHES, headers=h).json()] == ["alice"]
    r = api.client.post(f"{BATCHES}/nightly/disable", headers=h)
    assert r.status_code == 200 and r.json()["enabled"] is False
    assert r.json()["next_fire_at"] is None


def test_enable_disable_are_idempotent(api: Api) -> None:
    create(api, enabled=False)
    h = api.as_("alice")
    for action, enabled in [("enable", True), ("enable", True), ("disable", False)] * 2:
        r = api.client.post(f"{BATCHES}/nightly/{action}", headers=h)
        assert r.status_code == 200 and r.json()["enabled"] is enabled
    assert api.client.post(f"{BATCHES}/nope/enable", headers=h).status_code == 404


def test_replace_changes_cron_and_can_rename(api: Api) -> None:
    create(api)
    h = api.as_("alice")
    r = api.client.put(
        f"{BATCHES}/nightly",
        json=body(
            name="hourly", cron="0 * * * *", timezone="UTC", catch_up="skip", concurrency="forbid"
        ),
        headers=h,
    )
    assert r.status_code == 200, r.text
    changed = r.json()
    assert (changed["name"], changed["cron"], changed["catch_up"], changed["concurrency"]) == (
        "hourly",
        "0 * * * *",
        "skip",
        "forbid",
    )
    assert r.json()["next_fire_at"].endswith("+00:00")
    assert api.client.get(f"{BATCHES}/nightly", headers=h).status_code == 404
    r = api.client.put(f"{BATCHES}/hourly", json=body(cron="bad"), headers=h)
    assert locs(r) == [["body", "cron"]]


def test_firings_history_and_delete(api: Api) -> None:
    b = create(api, cron="* * * * *", timezone="Europe/Berlin")
    with api.factory() as session:
        row = session.get(BatchSchedule, b["id"])
        assert row is not None
        minute = row.active_from.replace(second=0, microsecond=0).astimezone(UTC)
    # Two minutes later (an injected clock): only the latest minute runs, once.
    report = service.fire_due(
        factory=api.factory, limits=RuntimeLimits(), now=minute + timedelta(minutes=2, seconds=1)
    )
    assert report.count("submitted") == 1
    h = api.as_("alice")
    firings = api.client.get(f"{BATCHES}/nightly/firings", headers=h).json()
    assert len(firings) == 1
    assert firings[0]["fire_at"].endswith(("+01:00", "+02:00"))
    assert firings[0]["skipped"] is False and len(firings[0]["job_ids"]) == 1
    job_id = firings[0]["job_ids"][0]
    job = api.client.get(f"/api/v1/jobs/{job_id}", headers=h).json()
    assert job["user"] == "alice" and job["labels"] == {"batch": "nightly"}
    got = api.client.get(f"{BATCHES}/nightly", headers=h).json()
    assert got["last_fired_at"] == firings[0]["fire_at"]
    assert api.client.delete(f"{BATCHES}/nightly", headers=h).status_code == 204
    assert api.client.get(f"{BATCHES}/nightly", headers=h).status_code == 404
    assert api.client.get(f"/api/v1/jobs/{job_id}", headers=h).status_code == 200


def test_run_by_hand_over_rest_and_who_may(api: Api) -> None:
    create(api, concurrency="forbid")
    api.add_user("carol", ["ml"])
    assert api.client.post(f"{BATCHES}/nightly/run").status_code == 401
    assert api.client.post(f"{BATCHES}/nightly/run", headers=api.as_("bob")).status_code == 404
    assert api.client.post(f"{BATCHES}/nightly/run", headers=api.as_("carol")).status_code == 403
    assert api.client.post(f"{BATCHES}/nope/run", headers=api.as_("alice")).status_code == 404

    r = api.client.post(f"{BATCHES}/nightly/run", headers=api.as_("alice"))
    assert r.status_code == 201, r.text
    firing = r.json()
    assert firing["run_by"] == "alice" and firing["skipped"] is False
    (job_id,) = firing["job_ids"]
    h = api.as_("alice")
    assert api.client.get(f"{BATCHES}/nightly/firings", headers=h).json() == [firing]
    assert api.client.get(f"{BATCHES}/nightly", headers=h).json()["last_fired_at"] is None
    job = api.client.get(f"/api/v1/jobs/{job_id}", headers=h).json()
    assert (job["status"], job["labels"]) == ("PENDING", {"batch": "nightly"})
    # forbid: the first run's job has not ended.
    r = api.client.post(f"{BATCHES}/nightly/run", headers=api.as_("admin"))
    assert r.status_code == 409
    assert r.json()["detail"] == (
        f"jobs {job_id} of an earlier firing have not ended (concurrency: forbid): "
        "cancel them or wait until they end"
    )
    trail = api.client.get(
        "/api/v1/audit", params={"action": "batch.run"}, headers=api.as_("admin")
    )
    assert [(e["actor"], e["target"], e["info"]) for e in trail.json()["items"]] == [
        ("alice", "nightly", {"job_ids": [job_id]})
    ]
