"""The cluster's time limits (GPUSCHED_DEFAULT_MAX_RUNTIME_S, GPUSCHED_MAX_RUNTIME_LIMIT_S),
as Slurm's DefaultTime and MaxTime, and the longest grace period (GPUSCHED_MAX_GRACE_S):
applied to submissions, batch templates and firings."""

from __future__ import annotations

import pytest

from app.config import SettingsError, load_settings
from app.errors import FieldError
from app.jobs.limits import ProjectTimeLimit, RuntimeLimits
from app.jobs.models import Job
from app.jobs.schemas import JobCreate

HOUR, DAY = 3600, 86400


@pytest.mark.parametrize(
    ("limits", "asked", "expected"),
    [
        (RuntimeLimits(), None, None),  # no limits: a job may run forever
        (RuntimeLimits(), 30 * DAY, 30 * DAY),
        (RuntimeLimits(default_s=DAY), None, DAY),
        (RuntimeLimits(default_s=DAY), 3 * DAY, 3 * DAY),  # a default does not cap
        (RuntimeLimits(max_s=7 * DAY), None, 7 * DAY),  # no default: the longest limit
        (RuntimeLimits(max_s=7 * DAY), 7 * DAY, 7 * DAY),
        (RuntimeLimits(default_s=DAY, max_s=7 * DAY), None, DAY),
        (RuntimeLimits(default_s=DAY, max_s=7 * DAY), HOUR, HOUR),
    ],
)
def test_a_job_gets_its_own_limit_else_the_default_else_the_longest(limits, asked, expected):
    spec = JobCreate(command=["train"], max_runtime_s=asked)
    assert limits.apply(spec).max_runtime_s == expected


INTERNS = ProjectTimeLimit(name="interns", max_s=4 * HOUR)


@pytest.mark.parametrize(
    ("limits", "asked", "expected"),
    [
        (RuntimeLimits(), None, 4 * HOUR),  # no cluster limits: the project's
        (RuntimeLimits(), 2 * HOUR, 2 * HOUR),
        (RuntimeLimits(), 4 * HOUR, 4 * HOUR),
        (RuntimeLimits(default_s=DAY), None, 4 * HOUR),  # the default, cut to the project's
        (RuntimeLimits(default_s=HOUR), None, HOUR),  # a shorter default stays
        (RuntimeLimits(max_s=7 * DAY), None, 4 * HOUR),
    ],
)
def test_a_projects_longest_limit_cuts_the_default(limits, asked, expected):
    spec = JobCreate(command=["train"], max_runtime_s=asked)
    assert limits.apply(spec, project=INTERNS).max_runtime_s == expected


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        (
            {"max_runtime_s": 5 * HOUR},
            "max_runtime_s",
            "18000 s (5h) is above the longest time limit of project interns, 14400 s (4h)",
        ),
        (
            {"estimated_runtime_s": 5 * HOUR},
            "estimated_runtime_s",
            "18000 s (5h) is longer than the job's time limit, 14400 s (4h) (the longest of"
            " project interns): it would be stopped first; set max_runtime_s",
        ),
        (
            {"max_runtime_s": HOUR, "estimated_runtime_s": 2 * HOUR},
            "estimated_runtime_s",
            "7200 s (2h) is longer than the job's time limit, 3600 s (1h) (its max_runtime_s):"
            " it would be stopped first; set max_runtime_s up to 14400 s (4h)",
        ),
    ],
)
def test_a_limit_above_the_projects_is_refused_on_its_field(body, field, message):
    with pytest.raises(FieldError) as refused:
        RuntimeLimits(max_s=7 * DAY).apply(JobCreate(command=["train"], **body), project=INTERNS)
    assert refused.value.field == field and str(refused.value) == message


@pytest.mark.parametrize(
    ("limits", "body", "field", "message"),
    [
        (
            RuntimeLimits(max_s=7 * DAY),
            {"max_runtime_s": 8 * DAY},
            "max_runtime_s",
            "691200 s (8d) is above this cluster's longest time limit, 604800 s (7d)",
        ),
        (
            RuntimeLimits(default_s=DAY),
            {"estimated_runtime_s": 2 * DAY},
            "estimated_runtime_s",
            "172800 s (2d) is longer than the job's time limit, 86400 s (1d) (the cluster's"
            " default): it would be stopped first; set max_runtime_s",
        ),
        (
            RuntimeLimits(default_s=DAY, max_s=7 * DAY),
            {"max_runtime_s": 5400, "estimated_runtime_s": 2 * HOUR},
            "estimated_runtime_s",
            "7200 s (2h) is longer than the job's time limit, 5400 s (1h30m) (its"
            " max_runtime_s): it would be stopped first; set max_runtime_s up to 604800 s (7d)",
        ),
        (
            RuntimeLimits(),  # 600 s unless the cluster says otherwise
            {"grace_s": 900},
            "grace_s",
            "900 s (15m) is above this cluster's longest grace period, 600 s (10m)",
        ),
    ],
)
def test_a_limit_a_job_cannot_meet_is_refused_on_its_field(limits, body, field, message):
    with pytest.raises(FieldError) as refused:
        limits.apply(JobCreate(command=["train"], **body))
    assert refused.value.field == field and str(refused.value) == message


def test_default_above_the_longest_limit_is_a_settings_error():
    with pytest.raises(SettingsError, match=r"GPUSCHED_MAX_RUNTIME_LIMIT_S: .*below"):
        load_settings(default_max_runtime_s=2 * DAY, max_runtime_limit_s=DAY)


def _limited(api, **limits):
    state = api.client.app.state
    state.settings = state.settings.model_copy(update=limits)


def test_submissions_get_the_default_and_are_held_to_the_longest_limit(api):
    _limited(api, default_max_runtime_s=DAY, max_runtime_limit_s=7 * DAY)
    alice = api.as_("alice")
    r = api.client.post("/api/v1/jobs", json={"command": ["train"]}, headers=alice)
    assert r.status_code == 201, r.text
    assert r.json()["max_runtime_s"] == DAY
    # The stored job is what the agent enforces and what backfill plans with.
    with api.factory() as session:
        assert session.get_one(Job, r.json()["id"]).max_runtime_s == DAY

    r = api.client.post(
        "/api/v1/jobs", json={"command": ["train"], "max_runtime_s": 8 * DAY}, headers=alice
    )
    assert r.status_code == 422
    (error,) = r.json()["errors"]
    assert error["loc"] == ["body", "max_runtime_s"] and "longest time limit" in error["msg"]

    # A batch whose job asks too much is refused when it is made, not at 2 am.
    batch = {
        "name": "nightly",
        "cron": "0 2 * * *",
        "templates": [{"command": ["train"]}, {"command": ["eval"], "max_runtime_s": 8 * DAY}],
    }
    r = api.client.post("/api/v1/batches", json=batch, headers=alice)
    assert r.status_code == 422
    assert r.json()["errors"][0]["loc"] == ["body", "templates", 1, "max_runtime_s"]


def test_a_job_asks_for_its_grace_period_within_the_clusters_bound(api):
    _limited(api, max_grace_s=120)
    alice = api.as_("alice")
    r = api.client.post("/api/v1/jobs", json={"command": ["train"], "grace_s": 120}, headers=alice)
    assert r.status_code == 201, r.text
    assert r.json()["grace_s"] == 120
    with api.factory() as session:
        assert session.get_one(Job, r.json()["id"]).grace_s == 120
    plain = api.client.post("/api/v1/jobs", json={"command": ["train"]}, headers=alice)
    assert plain.json()["grace_s"] is None  # the node agent's own (GPUSCHED_AGENT_GRACE_S)

    for grace, message in (
        (121, "121 s (2m1s) is above this cluster's longest grace period, 120 s (2m)"),
        (-1, "Input should be greater than or equal to 0"),
    ):
        r = api.client.post(
            "/api/v1/jobs", json={"command": ["train"], "grace_s": grace}, headers=alice
        )
        assert r.status_code == 422, r.text
        (error,) = r.json()["errors"]
        assert (error["loc"], error["msg"]) == (["body", "grace_s"], message)

    # A pending job's grace can be changed and cleared, within the same bound.
    path = f"/api/v1/jobs/{plain.json()['id']}"
    assert api.client.patch(path, json={"grace_s": 60}, headers=alice).json()["grace_s"] == 60
    r = api.client.patch(path, json={"grace_s": 600}, headers=alice)
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "grace_s"]
    assert api.client.patch(path, json={"grace_s": None}, headers=alice).json()["grace_s"] is None


@pytest.mark.parametrize(
    ("limits", "body", "kept", "expected"),
    [
        # Kept as admitted: not judged again by the limit lowered since.
        (RuntimeLimits(max_s=DAY), {"max_runtime_s": 2 * DAY}, {"max_runtime_s"}, 2 * DAY),
        (RuntimeLimits(), {"max_runtime_s": 5 * HOUR}, {"max_runtime_s"}, 5 * HOUR),  # interns
        (RuntimeLimits(max_grace_s=60), {"grace_s": 300, "max_runtime_s": HOUR}, {"grace_s"}, HOUR),
        # A job admitted with no limit keeps none (no default filled in by a change).
        (RuntimeLimits(default_s=DAY), {}, {"max_runtime_s"}, None),
    ],
)
def test_what_a_change_keeps_is_not_judged_again(limits, body, kept, expected):
    spec = limits.apply(JobCreate(command=["train"], **body), project=INTERNS, kept=kept)
    assert spec.max_runtime_s == expected


def test_a_kept_limit_still_bounds_a_new_estimate():
    with pytest.raises(FieldError) as refused:
        RuntimeLimits().apply(
            JobCreate(command=["train"], max_runtime_s=HOUR, estimated_runtime_s=2 * HOUR),
            kept={"max_runtime_s"},
        )
    assert refused.value.field == "estimated_runtime_s"


def test_a_job_admitted_before_a_limit_was_lowered_can_still_be_changed(api):
    """As in Slurm, a job keeps what it was admitted with: lowering the cluster's longest
    time limit or grace period, or a project's, refuses new values, not other changes."""
    alice = api.as_("alice")
    r = api.client.post(
        "/api/v1/jobs",
        json={"command": ["train"], "max_runtime_s": 3 * DAY, "grace_s": 300, "hold": True},
        headers=alice,
    )
    path = f"/api/v1/jobs/{r.json()['id']}"
    _limited(api, max_runtime_limit_s=DAY, max_grace_s=60)
    api.client.patch(
        "/api/v1/projects/ml",
        json={"max_runtime_s": 2 * DAY, "max_priority": 5},
        headers=api.as_("admin"),
    )

    r = api.client.patch(path, json={"priority": 5, "max_runtime_s": 3 * DAY}, headers=alice)
    assert r.status_code == 200, r.text
    assert (r.json()["priority"], r.json()["max_runtime_s"], r.json()["grace_s"]) == (
        5,
        3 * DAY,
        300,
    )
    # A new value is judged by the limits as they are now.
    for body, field in (
        ({"max_runtime_s": 2 * DAY}, "max_runtime_s"),
        ({"grace_s": 120}, "grace_s"),
    ):
        r = api.client.patch(path, json=body, headers=alice)
        assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", field], r.text
    assert api.client.patch(path, json={"max_runtime_s": HOUR}, headers=alice).status_code == 200
