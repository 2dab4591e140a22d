"""Off-peak windows over REST: admin changes them, everyone reads them."""

from __future__ import annotations

NIGHT = {
    "name": "night",
    "timezone": "Europe/Berlin",
    "daily": [{"start": "22:00", "end": "06:00"}],
    "capacity_outside_fraction": 0.5,
}


def test_crud_and_roles(api):
    r = api.client.post("/api/v1/windows", json=NIGHT, headers=api.as_("alice"))
    assert r.status_code == 403
    r = api.client.post("/api/v1/windows", json=NIGHT, headers=api.as_("admin"))
    assert r.status_code == 201, r.text
    assert r.json()["daily"][0]["start"] == "22:00"
    assert (
        api.client.post("/api/v1/windows", json=NIGHT, headers=api.as_("admin")).status_code == 409
    )
    listed = api.client.get("/api/v1/windows", headers=api.as_("alice")).json()
    assert [w["name"] for w in listed] == ["night"]
    cron = {"name": "night", "timezone": "UTC", "cron": "0 1 * * *", "duration_s": 3600}
    r = api.client.put("/api/v1/windows/night", json=cron, headers=api.as_("admin"))
    assert r.status_code == 200 and r.json()["cron"] == "0 1 * * *" and r.json()["daily"] is None
    assert api.client.delete("/api/v1/windows/night", headers=api.as_("alice")).status_code == 403
    assert api.client.delete("/api/v1/windows/night", headers=api.as_("admin")).status_code == 204
    assert api.client.get("/api/v1/windows/night", headers=api.as_("admin")).status_code == 404


def test_invalid_windows_name_the_field(api):
    cases = [
        ({"name": "w", "timezone": "UTC", "cron": "61 * * * *", "duration_s": 60}, "cron"),
        (
            {"name": "w", "timezone": "Mars/Olympus", "cron": "0 1 * * *", "duration_s": 60},
            "timezone",
        ),
        ({"name": "w", "timezone": "UTC", "cron": "0 1 * * *", "duration_s": 0}, "duration_s"),
        ({"name": "w", "timezone": "UTC"}, "daily"),
    ]
    for body, field in cases:
        r = api.client.post("/api/v1/windows", json=body, headers=api.as_("admin"))
        assert r.status_code == 422, (body, r.text)
        assert any(e["loc"][:2] == ["body", field] for e in r.json()["errors"]), r.json()


def test_upcoming_lists_openings_with_offsets(api):
    api.client.post("/api/v1/windows", json=NIGHT, headers=api.as_("admin"))
    r = api.client.get("/api/v1/windows/upcoming?days=3", headers=api.as_("bob"))
    assert r.status_code == 200
    items = r.json()
    assert 3 <= len(items) <= 4
    for item in items:
        assert item["window"] == "night"
        assert item["opens_at"][11:16] == "22:00" and item["opens_at"][-6:] in ("+01:00", "+02:00")
        assert item["closes_at"][11:16] == "06:00"
    assert (
        api.client.get("/api/v1/windows/upcoming?days=0", headers=api.as_("bob")).status_code == 422
    )


def test_a_job_for_an_undefined_window_is_refused_naming_the_defined_ones(api):
    job = {"command": "true", "gpus": 1, "schedule": {"mode": "offpeak", "window": "nigth"}}
    r = api.client.post("/api/v1/jobs", json=job, headers=api.as_("alice"))
    assert r.status_code == 422, r.text
    [error] = r.json()["errors"]
    assert error["loc"] == ["body", "schedule", "window"]
    assert error["msg"] == "no off-peak window named 'nigth'; defined: none"

    api.client.post("/api/v1/windows", json=NIGHT, headers=api.as_("admin"))
    r = api.client.post("/api/v1/jobs", json=job, headers=api.as_("alice"))
    assert r.json()["errors"][0]["msg"] == "no off-peak window named 'nigth'; defined: night"
    job["schedule"]["window"] = "night"
    assert api.client.post("/api/v1/jobs", json=job, headers=api.as_("alice")).status_code == 201


def test_a_window_in_use_is_not_deleted_or_renamed(api):
    admin = api.as_("admin")
    api.client.post("/api/v1/windows", json=NIGHT, headers=admin)
    job = {"command": ["train"], "schedule": {"mode": "offpeak", "window": "night"}}
    ids = [api.client.post("/api/v1/jobs", json=job, headers=api.as_("alice")).json()["id"]]
    batch = {
        "name": "nightly",
        "cron": "0 2 * * *",
        "timezone": "UTC",
        "target": "offpeak",
        "window": "night",
        "templates": [{"command": ["train"], "project": "ml"}],
    }
    assert api.client.post("/api/v1/batches", json=batch, headers=admin).status_code == 201

    r = api.client.delete("/api/v1/windows/night", headers=admin)
    assert r.status_code == 409
    assert r.json()["detail"] == (
        f"window 'night' cannot be deleted: pending job {ids[0]} and batch nightly use it;"
        " first let the jobs start or cancel them, and delete the batches or give them another"
        " window"
    )
    renamed = {**NIGHT, "name": "late"}
    r = api.client.put("/api/v1/windows/night", json=renamed, headers=admin)
    assert r.status_code == 409 and "cannot be renamed" in r.json()["detail"]
    # Changing the hours keeps the name: the jobs and the batch follow the new hours.
    hours = {**NIGHT, "daily": [{"start": "23:00", "end": "05:00"}]}
    assert api.client.put("/api/v1/windows/night", json=hours, headers=admin).status_code == 200

    assert api.client.delete("/api/v1/batches/nightly", headers=admin).status_code == 204
    r = api.client.delete("/api/v1/windows/night", headers=admin)
    assert r.json()["detail"] == (
        f"window 'night' cannot be deleted: pending job {ids[0]} uses it;"
        " first let the jobs start or cancel them"
    )
    ids += [api.client.post("/api/v1/jobs", json=job, headers=api.as_("alice")).json()["id"]]
    r = api.client.delete("/api/v1/windows/night", headers=admin)
    assert r.json()["detail"] == (
        f"window 'night' cannot be deleted: pending jobs {ids[0]}, {ids[1]} use it;"
        " first let the jobs start or cancel them"
    )
    for job_id in ids:
        api.client.post(f"/api/v1/jobs/{job_id}/cancel", headers=api.as_("alice"))
    assert api.client.delete("/api/v1/windows/night", headers=admin).status_code == 204


def test_off_peak_work_needs_some_window(api):
    """Off-peak work that names no window waits for any window: with none defined it would
    never start, so it is refused; and the last window cannot be deleted under it."""
    admin = api.as_("admin")
    job = {"command": ["train"], "schedule": {"mode": "offpeak"}}
    r = api.client.post("/api/v1/jobs", json=job, headers=api.as_("alice"))
    assert r.status_code == 422, r.text
    [error] = r.json()["errors"]
    assert error["loc"] == ["body", "schedule", "window"]
    assert error["msg"].startswith("no off-peak window is defined, so off-peak work would never")
    batch = {"name": "nightly", "cron": "0 2 * * *", "timezone": "UTC", "target": "offpeak",
             "templates": [{"command": ["train"], "project": "ml"}]}  # fmt: skip
    r = api.client.post("/api/v1/batches", json=batch, headers=admin)
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "window"]
    # Work that does not wait for a window is not concerned.
    assert (
        api.client.post("/api/v1/jobs", json={"command": ["x"]}, headers=admin).status_code == 201
    )

    api.client.post("/api/v1/windows", json=NIGHT, headers=admin)
    job_id = api.client.post("/api/v1/jobs", json=job, headers=api.as_("alice")).json()["id"]
    weekend = {**NIGHT, "name": "weekend"}
    assert api.client.post("/api/v1/windows", json=weekend, headers=admin).status_code == 201
    # With another window left the job still has one to wait for.
    assert api.client.delete("/api/v1/windows/weekend", headers=admin).status_code == 204
    r = api.client.delete("/api/v1/windows/night", headers=admin)
    assert r.status_code == 409
    assert r.json()["detail"] == (
        f"window 'night' cannot be deleted: pending job {job_id} uses it (the only window, so"
        " off-peak work that names none waits for it); first let the jobs start or cancel them"
    )
    api.client.post(f"/api/v1/jobs/{job_id}/cancel", headers=api.as_("alice"))
    assert api.client.delete("/api/v1/windows/night", headers=admin).status_code == 204


def test_a_non_preemptible_off_peak_job_longer_than_every_opening_is_refused(api):
    """It could never start (it must end before the close): refused at submission and on
    a change, naming the longest opening; preemptible or short enough, it is accepted."""
    api.client.post("/api/v1/windows", json=NIGHT, headers=api.as_("admin"))  # 8 h, Berlin
    hourly = {"name": "hourly", "timezone": "UTC", "cron": "0 * * * *", "duration_s": 1800}
    api.client.post("/api/v1/windows", json=hourly, headers=api.as_("admin"))
    ten_hours = {
        "command": "train",
        "gpus": 1,
        "max_runtime_s": 36000,
        "schedule": {"mode": "offpeak"},  # any window: the longest is night's
    }
    r = api.client.post("/api/v1/jobs", json=ten_hours, headers=api.as_("alice"))
    assert r.status_code == 422, r.text
    [error] = r.json()["errors"]
    assert error["loc"] == ["body", "max_runtime_s"]
    # Across the autumn DST change, a night is one hour longer: 9 h is its longest.
    assert error["msg"].startswith(
        "36000 s (10h) is longer than the longest opening of off-peak window 'night', "
        "32400 s (9h): a job that is not preemptible must end before its window closes"
    )
    # The estimate decides when there is one; the window named is the one judged.
    estimated = {**ten_hours, "estimated_runtime_s": 3600, "schedule": {"mode": "offpeak", "window": "hourly"}}  # fmt: skip
    r = api.client.post("/api/v1/jobs", json=estimated, headers=api.as_("alice"))
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "estimated_runtime_s"]
    assert "window 'hourly', 1800 s (30m)" in r.json()["errors"][0]["msg"]

    for fits in ({**ten_hours, "preemptible": True}, {**ten_hours, "max_runtime_s": 7 * 3600}):
        r = api.client.post("/api/v1/jobs", json=fits, headers=api.as_("alice"))
        assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    r = api.client.patch(
        f"/api/v1/jobs/{job_id}", json={"max_runtime_s": 36000}, headers=api.as_("alice")
    )
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "max_runtime_s"]
