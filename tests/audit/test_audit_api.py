"""The audit trail over REST: every administrative change says who made it and what changed."""

from __future__ import annotations

from typing import Any

from tests.foundation.builders import add_node

NIGHT = {"name": "night", "timezone": "UTC", "daily": [{"start": "22:00", "end": "06:00"}]}


def _events(api, **params: Any) -> list[dict[str, Any]]:
    r = api.client.get("/api/v1/audit", params=params, headers=api.as_("admin"))
    assert r.status_code == 200, r.text
    # Without the fixture's own users (created with actor "test").
    return [e for e in r.json()["items"] if e["actor"] != "test"]


def _summary(api, **params: Any) -> list[tuple[str, str, str, dict[str, Any]]]:
    return [(e["actor"], e["action"], e["target"], e["info"]) for e in _events(api, **params)]


def test_quota_drain_and_window_changes_are_recorded_newest_first(api):
    admin = api.as_("admin")
    add_node(api.factory, "n1", gpus=4)
    assert api.client.patch("/api/v1/projects/ml", json={"gpu_quota": 4}, headers=admin).is_success
    # The same values again change nothing, so nothing is recorded.
    assert api.client.patch("/api/v1/projects/ml", json={"gpu_quota": 4}, headers=admin).is_success
    body = {"gpu_quota": 2, "weight": 3}
    assert api.client.patch("/api/v1/projects/ml", json=body, headers=admin).is_success
    drain = {"reason": "bad fan"}
    assert api.client.post("/api/v1/nodes/n1/drain", json=drain, headers=admin).is_success
    assert api.client.post("/api/v1/nodes/n1/undrain", headers=admin).is_success
    assert api.client.post("/api/v1/windows", json=NIGHT, headers=admin).status_code == 201
    later = {**NIGHT, "daily": [{"start": "23:00", "end": "05:00"}]}
    assert api.client.put("/api/v1/windows/night", json=later, headers=admin).is_success
    assert api.client.delete("/api/v1/windows/night", headers=admin).status_code == 204

    hours = {"days": None, "start": "23:00", "end": "05:00"}
    settings = {"name": "night", "timezone": "UTC", "cron": None, "duration_s": None,
                "capacity_outside_fraction": 0.0, "preempt_on_close": True}  # fmt: skip
    assert _summary(api) == [
        ("admin", "window.delete", "night", {**settings, "daily": [hours]}),
        ("admin", "window.replace", "night",
         {"daily": {"from": [{**hours, "start": "22:00", "end": "06:00"}], "to": [hours]}}),
        ("admin", "window.create", "night",
         {**settings, "daily": [{**hours, "start": "22:00", "end": "06:00"}]}),
        ("admin", "node.undrain", "n1", {}),
        ("admin", "node.drain", "n1", {"reason": "bad fan"}),
        ("admin", "project.update", "ml",
         {"gpu_quota": {"from": 4, "to": 2}, "weight": {"from": 1.0, "to": 3.0}}),
        ("admin", "project.update", "ml", {"gpu_quota": {"from": 0, "to": 4}}),
    ]  # fmt: skip

    # One line for people, shown as is by the CLI and the dashboard.
    assert [e["summary"] for e in _events(api)][1:] == [
        "daily (start=22:00 end=06:00) -> (start=23:00 end=05:00)",
        "name=night, timezone=UTC, daily=(start=22:00 end=06:00), capacity_outside_fraction=0.0,"
        " preempt_on_close=True",
        "",
        "reason=bad fan",
        "gpu_quota 4 -> 2, weight 1.0 -> 3.0",
        "gpu_quota 0 -> 4",
    ]

    # Filters, and paging from the newest: next_before continues with older changes.
    assert [e["info"] for e in _events(api, target="ml", action="project.update", limit=1)] == [
        {"gpu_quota": {"from": 4, "to": 2}, "weight": {"from": 1.0, "to": 3.0}}
    ]
    page = api.client.get("/api/v1/audit", params={"limit": 6}, headers=admin).json()
    older = _events(api, before=page["next_before"])
    assert [e["info"] for e in older] == [{"gpu_quota": {"from": 0, "to": 4}}]
    last = api.client.get("/api/v1/audit", params={"before": older[0]["id"]}, headers=admin)
    # Only the fixture's own users are older; and it is the last page.
    assert {e["actor"] for e in last.json()["items"]} == {"test"}
    assert last.json()["next_before"] is None


def test_refused_changes_leave_no_record_and_only_admins_read_it(api):
    admin = api.as_("admin")
    assert api.client.post("/api/v1/windows", json=NIGHT, headers=admin).status_code == 201
    assert api.client.post("/api/v1/windows", json=NIGHT, headers=admin).status_code == 409
    job = {"command": ["train"], "schedule": {"mode": "offpeak", "window": "night"}}
    assert api.client.post("/api/v1/jobs", json=job, headers=api.as_("alice")).status_code == 201
    assert api.client.delete("/api/v1/windows/night", headers=admin).status_code == 409
    r = api.client.patch("/api/v1/projects/ml", json={"gpu_quota": -1}, headers=admin)
    assert r.status_code == 422
    assert [e["action"] for e in _events(api)] == ["window.create"]

    r = api.client.get("/api/v1/audit", headers=api.as_("alice"))
    assert r.status_code == 403
    r = api.client.get("/api/v1/audit", params={"limit": 0}, headers=admin)
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["query", "limit"]


def test_batch_changes_are_recorded_and_outlive_a_deleted_batch(api):
    # A batch is deleted with its firing history: the trail still says who did what.
    nightly = {"name": "nightly", "cron": "0 2 * * *", "templates": [{"command": ["train"]}]}
    alice, admin = api.as_("alice"), api.as_("admin")
    assert api.client.post("/api/v1/batches", json=nightly, headers=alice).status_code == 201
    hourly = {**nightly, "cron": "0 * * * *", "concurrency": "forbid"}
    assert api.client.put("/api/v1/batches/nightly", json=hourly, headers=alice).is_success
    assert api.client.put("/api/v1/batches/nightly", json=hourly, headers=alice).is_success
    assert api.client.post("/api/v1/batches/nightly/disable", headers=admin).is_success
    assert api.client.post("/api/v1/batches/nightly/disable", headers=admin).is_success
    assert api.client.delete("/api/v1/batches/nightly", headers=admin).status_code == 204
    stored = {
        "name": "nightly",
        "cron": "0 * * * *",
        "timezone": "UTC",
        "templates": [{"command": ["train"], "project": "ml"}],
        "target": "now",
        "window": None,
        "catch_up": "once",
        "concurrency": "forbid",
        "enabled": False,
    }
    assert _summary(api, target="nightly") == [
        ("admin", "batch.delete", "nightly", stored),
        ("admin", "batch.disable", "nightly", {}),
        # The same body again changes nothing, so nothing is recorded.
        (
            "alice",
            "batch.replace",
            "nightly",
            {
                "cron": {"from": "0 2 * * *", "to": "0 * * * *"},
                "concurrency": {"from": "allow", "to": "forbid"},
            },
        ),
        (
            "alice",
            "batch.create",
            "nightly",
            {**stored, "cron": "0 2 * * *", "concurrency": "allow", "enabled": True},
        ),
    ]
