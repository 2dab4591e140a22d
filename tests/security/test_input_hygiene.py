"""Input hygiene: ids beyond what the database stores are a 422 (they were a 500: an
integer past 64 bits reached the driver), and names people read back (users, projects,
jobs, windows, batches, labels) refuse control characters and empty strings with a 422
naming the field."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest
from typer.testing import CliRunner

from app.cli import app as cli_app
from app.config import Settings
from tests.conftest import Api

HUGE = 2**63  # 9223372036854775808: one past the largest 64-bit integer
ESCAPES = "\x1b]0;TITLE\x07\x1b[2J"
NAMES_REFUSED = [
    "",
    "   ",
    f"evil{ESCAPES}",
    "a\x00b",
    "tab\there",
    "line\nbreak",
    "bidi\u202eevil",
]


def _loc(r: Any) -> list[Any]:
    assert r.status_code == 422, r.text
    loc: list[Any] = r.json()["errors"][0]["loc"]
    return loc


@pytest.mark.parametrize("ids", [[HUGE], [2**31], [2**70], [1, HUGE]])
def test_ids_beyond_the_database_are_refused_on_submit_and_patch(api: Api, ids: list[int]) -> None:
    alice = api.as_("alice")
    r = api.client.post("/api/v1/jobs", json={"command": ["t"], "depends_on": ids}, headers=alice)
    assert _loc(r)[:2] == ["body", "depends_on"]
    job = api.client.post("/api/v1/jobs", json={"command": ["t"]}, headers=alice).json()["id"]
    r = api.client.patch(f"/api/v1/jobs/{job}", json={"depends_on": ids}, headers=alice)
    assert _loc(r)[:2] == ["body", "depends_on"]
    r = api.client.patch(
        "/api/v1/jobs", params={"user": "alice"}, json={"depends_on": ids}, headers=alice
    )
    assert _loc(r)[:2] == ["body", "depends_on"]


@pytest.mark.parametrize(
    "path",
    [
        f"/api/v1/jobs/{HUGE}",
        f"/api/v1/jobs/{HUGE}/events",
        f"/api/v1/jobs/{HUGE}/rank",
        f"/api/v1/jobs?array={HUGE}",
        f"/api/v1/queue?array={HUGE}",
        f"/api/v1/jobs?cursor={HUGE}",
        f"/api/v1/audit?before={HUGE}",
    ],
)
def test_ids_beyond_the_database_in_paths_and_queries_are_refused(api: Api, path: str) -> None:
    r = api.client.get(path, headers=api.as_("admin"))
    assert r.status_code == 422, r.text


@pytest.mark.parametrize("name", NAMES_REFUSED)
def test_names_refuse_control_characters_and_blanks(api: Api, name: str) -> None:
    admin, alice = api.as_("admin"), api.as_("alice")
    checks = [
        (api.client.post("/api/v1/users", json={"name": name, "projects": ["ml"]}, headers=admin),
         ["body", "name"]),
        (api.client.post("/api/v1/users", json={"name": "erin", "projects": [name]}, headers=admin),
         ["body", "projects", 0]),
        (api.client.post("/api/v1/jobs", json={"command": ["t"], "name": name}, headers=alice),
         ["body", "name"]),
        (api.client.post("/api/v1/jobs", json={"command": ["t"], "project": name}, headers=alice),
         ["body", "project"]),
        (api.client.post("/api/v1/windows", json={**_window(), "name": name}, headers=admin),
         ["body", "name"]),
        (api.client.post("/api/v1/batches", json={**_batch(), "name": name}, headers=alice),
         ["body", "name"]),
    ]  # fmt: skip
    if name.strip():  # a path cannot carry an empty name; a blank one is refused
        checks.append(
            (
                api.client.put(f"/api/v1/users/alice/projects/{quote(name)}", headers=admin),
                ["path", "project"],
            )
        )
    job = api.client.post("/api/v1/jobs", json={"command": ["t"]}, headers=alice).json()["id"]
    r = api.client.patch(f"/api/v1/jobs/{job}", json={"name": name}, headers=alice)
    checks.append((r, ["body", "name"]))
    for r, where in checks:
        assert _loc(r)[: len(where)] == where, (where, r.text)
    # Nothing was made.
    users = api.client.get("/api/v1/users", headers=admin).json()
    assert {u["name"] for u in users} == {"admin", "alice", "bob"}
    assert {p for u in users for p in u["projects"]} == {"default", "ml", "cv"}


@pytest.mark.parametrize("value", [ESCAPES, "a\x00b", "x\u2028y"])
def test_labels_refuse_control_characters(api: Api, value: str) -> None:
    body = {"command": ["t"], "labels": {"team": value}}
    r = api.client.post("/api/v1/jobs", json=body, headers=api.as_("alice"))
    assert _loc(r)[:3] == ["body", "labels", "team"]
    body = {"command": ["t"], "labels": {value: "x"}}
    assert _loc(api.client.post("/api/v1/jobs", json=body, headers=api.as_("alice")))[:2] == [
        "body",
        "labels",
    ]


def test_names_people_type_are_still_accepted(api: Api) -> None:
    for name in ("résumé-train", "训练", "run 7 (lr=3e-4)", "emoji 🚀"):
        r = api.client.post(
            "/api/v1/jobs", json={"command": ["t"], "name": name}, headers=api.as_("alice")
        )
        assert r.status_code == 201 and r.json()["name"] == name, r.text
    r = api.client.post("/api/v1/jobs", json={"command": ["t"], "labels": {"note": ""}},
                        headers=api.as_("alice"))  # fmt: skip
    assert r.status_code == 201, r.text


def test_a_job_named_by_its_program_gets_its_control_characters_written_out(api: Api) -> None:
    r = api.client.post(
        "/api/v1/jobs", json={"command": [f"/opt/bin/evil{ESCAPES}"]}, headers=api.as_("alice")
    )
    assert r.status_code == 201, r.text
    assert r.json()["name"] == "evil\\x1b]0;TITLE\\x07\\x1b[2J"


@pytest.mark.parametrize("name", [f"evil{ESCAPES}", "a\x00b"])
def test_gpusched_admin_refuses_control_characters(
    settings: Settings, api: Api, database_url: str, name: str
) -> None:
    env = {
        "GPUSCHED_DATA_DIR": str(settings.data_dir),
        "GPUSCHED_DATABASE_URL": database_url,
    }
    runner = CliRunner()
    for args in (["create-user", name, "--project", "ml"], ["create-user", "erin", "-p", name]):
        result = runner.invoke(cli_app, ["admin", *args], env=env)
        assert result.exit_code == 2, result.output
        assert "control characters" in result.stderr and "\x1b" not in result.stderr


def _window() -> dict[str, Any]:
    return {"name": "night", "timezone": "UTC", "daily": [{"start": "22:00", "end": "06:00"}]}


def _batch() -> dict[str, Any]:
    return {"name": "nightly", "cron": "0 2 * * *", "templates": [{"command": ["t"]}]}
