"""A window change that leaves waiting off-peak jobs without any opening long enough: a
job that is not preemptible must end before its window closes, so it could never start.
As Slurm leaves such a job pending with a reason, it is neither cancelled nor lost: it
waits with the typed reason `never_in_window`, naming the longest opening and its
runtime, until a window or the job changes. Real API and live cycles, both backends."""

from __future__ import annotations

from typing import Any

from tests.cycle.jobs_api import get_job, job_events, run_one_cycle, submit

NIGHT = {"name": "night", "timezone": "UTC", "daily": [{"start": "22:00", "end": "06:00"}]}
SHORT_NIGHT = {**NIGHT, "daily": [{"start": "23:00", "end": "05:00"}]}  # 6 h
HOURS_7_30 = 27000


def _window(api: Any, method: str, body: dict[str, Any], name: str = "") -> None:
    path = f"/api/v1/windows/{name}" if name else "/api/v1/windows"
    r = api.client.request(method, path, json=body, headers=api.as_("admin"))
    assert r.status_code in (200, 201), r.text


def _offpeak(api: Any, *, window: str | None = "night", **body: Any) -> int:
    schedule = {"mode": "offpeak", **({"window": window} if window else {})}
    body.setdefault("max_runtime_s", HOURS_7_30)
    return int(submit(api, gpus=1, schedule=schedule, **body)["id"])


def test_a_shorter_window_marks_the_jobs_it_can_never_hold_and_keeps_them(api: Any) -> None:
    _window(api, "POST", NIGHT)  # 8 h
    named = _offpeak(api)
    any_window = _offpeak(api, window=None)
    preemptible = _offpeak(api, preemptible=True)
    short = _offpeak(api, max_runtime_s=3600)
    estimated = _offpeak(api, max_runtime_s=36000 - 7200, estimated_runtime_s=HOURS_7_30)

    _window(api, "PUT", SHORT_NIGHT, "night")

    job = get_job(api, named)
    assert (job["status"], job["pending_reason"]) == ("PENDING", "never_in_window")
    assert job["pending_message"] == (
        "never starts: no opening of off-peak window 'night' is long enough since the windows"
        " changed: its longest is 21600 s (6h), the job's time limit 27000 s (7h30m), and a"
        " job that is not preemptible must end before its window closes; shorten it"
        " (gpusched update --estimated-runtime or --max-runtime), or cancel it and submit it"
        " preemptible"
    )
    assert job["estimated_start_at"] is None and job["queue_position"] is None
    assert job["estimate_note"] == (
        "no estimate: no opening of its off-peak window is long enough (see the reason)"
    )
    [event] = [e for e in job_events(api, named) if "never starts" in (e["reason"] or "")]
    assert event["actor"] == "admin"
    message = get_job(api, any_window)["pending_message"]
    assert "of any off-peak window is long enough" in message
    assert "the longest, 'night''s, is 21600 s (6h)" in message
    assert "runtime estimate 27000 s (7h30m)" in get_job(api, estimated)["pending_message"]
    for fits in (preemptible, short):
        assert get_job(api, fits)["pending_reason"] != "never_in_window"

    # The scheduler leaves them waiting with that reason: no cycle overwrites it.
    run_one_cycle(api)
    run_one_cycle(api)
    for job_id in (named, any_window, estimated):
        job = get_job(api, job_id)
        assert (job["status"], job["pending_reason"]) == ("PENDING", "never_in_window")

    # A wider window puts them back in line.
    _window(api, "PUT", NIGHT, "night")
    for job_id in (named, any_window, estimated):
        assert get_job(api, job_id)["pending_reason"] == "NEW"
    run_one_cycle(api)
    assert get_job(api, named)["pending_reason"] != "never_in_window"


def test_a_marked_job_shortened_goes_back_in_line(api: Any) -> None:
    _window(api, "POST", NIGHT)
    job_id = _offpeak(api)
    _window(api, "PUT", SHORT_NIGHT, "night")
    assert get_job(api, job_id)["pending_reason"] == "never_in_window"
    r = api.client.patch(
        f"/api/v1/jobs/{job_id}", json={"max_runtime_s": 3600}, headers=api.as_("alice")
    )
    assert r.status_code == 200, r.text
    run_one_cycle(api)
    assert get_job(api, job_id)["pending_reason"] != "never_in_window"
    assert get_job(api, job_id)["status"] == "PENDING"


def test_a_marked_job_takes_an_edit_that_leaves_its_runtime_and_keeps_its_reason(
    api: Any,
) -> None:
    _window(api, "POST", NIGHT)
    job_id = _offpeak(api)
    _window(api, "PUT", SHORT_NIGHT, "night")
    r = api.client.patch(f"/api/v1/jobs/{job_id}", json={"priority": -5}, headers=api.as_("alice"))
    assert r.status_code == 200, r.text
    run_one_cycle(api)
    job = get_job(api, job_id)
    assert (job["status"], job["priority"]) == ("PENDING", -5)
    assert job["pending_reason"] == "never_in_window"
    # A new runtime still too long is refused, as at submission.
    r = api.client.patch(
        f"/api/v1/jobs/{job_id}", json={"max_runtime_s": 25000}, headers=api.as_("alice")
    )
    assert r.status_code == 422, r.text
    assert "longest opening of off-peak window 'night', 21600 s (6h)" in r.text


def test_deleting_the_only_long_window_marks_the_jobs_that_needed_it(api: Any) -> None:
    _window(api, "POST", NIGHT)
    _window(api, "POST", {"name": "weekend", "timezone": "UTC", "cron": "0 0 * * 6",
                          "duration_s": 48 * 3600})  # fmt: skip
    job_id = _offpeak(api, window=None, max_runtime_s=10 * 3600)  # only the weekend holds it
    r = api.client.delete("/api/v1/windows/weekend", headers=api.as_("admin"))
    assert r.status_code == 204, r.text
    job = get_job(api, job_id)
    assert (job["status"], job["pending_reason"]) == ("PENDING", "never_in_window")
    assert (
        "the longest, 'night''s, is 28800 s (8h), the job's time limit 36000 s (10h)"
        in (job["pending_message"])
    )


def test_a_job_released_from_a_hold_after_the_change_is_judged_by_the_scheduler(
    api: Any,
) -> None:
    _window(api, "POST", NIGHT)
    job_id = _offpeak(api)
    assert api.client.post(f"/api/v1/jobs/{job_id}/hold", headers=api.as_("alice")).is_success
    _window(api, "PUT", SHORT_NIGHT, "night")
    assert get_job(api, job_id)["pending_reason"] != "never_in_window"  # held: not judged
    assert api.client.post(f"/api/v1/jobs/{job_id}/release", headers=api.as_("alice")).is_success
    run_one_cycle(api)
    job = get_job(api, job_id)
    assert (job["status"], job["pending_reason"]) == ("PENDING", "never_in_window")
    [event] = [e for e in job_events(api, job_id) if "never starts" in (e["reason"] or "")]
    assert event["actor"] == "scheduler"
