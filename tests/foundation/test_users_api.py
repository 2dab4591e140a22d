"""Users, their projects and tokens over the API (admin), as `gpusched admin` does with
the database and sacctmgr with slurmdbd: every change audited under the admin's name."""

from __future__ import annotations

from typing import Any


def _me(api: Any, token: str) -> Any:
    return api.client.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"})


def test_an_admin_creates_a_user_whose_token_works_at_once(api):
    admin = api.as_("admin")
    r = api.client.post(
        "/api/v1/users", json={"name": " erin ", "projects": ["ml", "vision"]}, headers=admin
    )
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["user"] == {
        "name": "erin", "is_admin": False, "projects": ["ml", "vision"], "active_tokens": 1,
        "unix_user": "erin",
        "max_pending_jobs": None, "max_running_jobs": None, "max_gpus": None,
    }  # fmt: skip
    me = _me(api, created["token"])
    assert me.status_code == 200 and me.json()["projects"] == ["ml", "vision"]

    again = api.client.post(
        "/api/v1/users", json={"name": "erin", "projects": ["ml"]}, headers=admin
    )
    assert again.status_code == 409 and again.json()["detail"] == "user 'erin' already exists"
    for body, field in (
        ({"name": "", "projects": ["ml"]}, "name"),
        ({"name": "x" * 65, "projects": ["ml"]}, "name"),
        ({"name": "frank", "projects": []}, "projects"),
    ):
        r = api.client.post("/api/v1/users", json=body, headers=admin)
        assert r.status_code == 422 and r.json()["errors"][0]["loc"][:2] == ["body", field], r.text

    users = api.client.get("/api/v1/users", headers=admin).json()
    assert [u["name"] for u in users] == ["admin", "alice", "bob", "erin"]


def test_projects_tokens_and_revocation(api):
    admin = api.as_("admin")
    r = api.client.put("/api/v1/users/alice/projects/nlp", headers=admin)
    assert r.status_code == 200 and r.json()["projects"] == ["ml", "nlp"]
    assert api.client.put("/api/v1/users/alice/projects/nlp", headers=admin).status_code == 200
    r = api.client.delete("/api/v1/users/alice/projects/ml", headers=admin)
    assert r.status_code == 200 and r.json()["projects"] == ["nlp"]
    last = api.client.delete("/api/v1/users/alice/projects/nlp", headers=admin)
    assert last.status_code == 409 and "without a project" in last.json()["detail"]
    absent = api.client.delete("/api/v1/users/alice/projects/cv", headers=admin)
    assert absent.status_code == 404 and "not in project(s) cv" in absent.json()["detail"]

    r = api.client.post("/api/v1/users/alice/tokens", json={"label": "laptop"}, headers=admin)
    assert r.status_code == 201 and r.json()["user"]["active_tokens"] == 2
    laptop = r.json()["token"]
    assert _me(api, laptop).json()["name"] == "alice"
    r = api.client.delete("/api/v1/users/alice/tokens", headers=admin)
    assert r.status_code == 200 and r.json()["revoked"] == 2
    assert r.json()["user"]["active_tokens"] == 0
    assert _me(api, laptop).status_code == 401

    own = api.client.delete("/api/v1/users/admin/tokens", headers=admin)
    assert own.status_code == 409 and "lock yourself out" in own.json()["detail"]
    for method, path in (
        ("POST", "/api/v1/users/nobody/tokens"),
        ("DELETE", "/api/v1/users/nobody/tokens"),
        ("PUT", "/api/v1/users/nobody/projects/ml"),
    ):
        r = api.client.request(method, path, headers=admin)
        assert r.status_code == 404 and r.json()["detail"] == "no user named 'nobody'"

    audit = api.client.get("/api/v1/audit?target=alice", headers=admin).json()["items"]
    assert [(e["actor"], e["action"]) for e in audit] == [
        ("admin", "token.revoke"),
        ("admin", "token.create"),
        ("admin", "user.remove_from_project"),
        ("admin", "user.add_to_project"),
        ("test", "user.create"),  # the suite's own setup
    ]


def test_an_admin_changes_a_users_role_and_the_last_admin_stays(api):
    admin = api.as_("admin")
    alice = api.as_("alice")
    assert api.client.get("/api/v1/users", headers=alice).status_code == 403

    r = api.client.patch("/api/v1/users/alice", json={"admin": True}, headers=admin)
    assert r.status_code == 200 and r.json()["is_admin"] is True
    assert api.client.get("/api/v1/users", headers=alice).status_code == 200  # at once
    again = api.client.patch("/api/v1/users/alice", json={"admin": True}, headers=admin)
    assert again.status_code == 200  # idempotent, and not audited twice

    # Stepping down is allowed while another admin remains; the last one is kept.
    r = api.client.patch("/api/v1/users/admin", json={"admin": False}, headers=admin)
    assert r.status_code == 200 and r.json()["is_admin"] is False
    assert api.client.get("/api/v1/users", headers=admin).status_code == 403
    last = api.client.patch("/api/v1/users/alice", json={"admin": False}, headers=alice)
    assert last.status_code == 409
    assert last.json()["detail"] == "'alice' is the last admin; make another user an admin first"

    for body, field in (({"admin": "yes"}, "admin"), ({"admin": 1}, "admin"), ({}, "admin")):
        r = api.client.patch("/api/v1/users/bob", json=body, headers=alice)
        assert r.status_code == 422 and r.json()["errors"][0]["loc"][:2] == ["body", field], r.text
    missing = api.client.patch("/api/v1/users/nobody", json={"admin": True}, headers=alice)
    assert missing.status_code == 404

    audit = api.client.get("/api/v1/audit?action=user.role", headers=alice).json()["items"]
    assert [(e["actor"], e["target"], e["info"]) for e in audit] == [
        ("admin", "admin", {"admin": {"from": True, "to": False}}),
        ("admin", "alice", {"admin": {"from": False, "to": True}}),
    ]


def test_an_admin_sets_the_unix_account_a_users_jobs_run_as(api):
    admin = api.as_("admin")
    body = {"name": "gus", "projects": ["ml"], "unix_user": "gus_x"}
    created = api.client.post("/api/v1/users", json=body, headers=admin)
    assert created.status_code == 201 and created.json()["user"]["unix_user"] == "gus_x"
    r = api.client.patch("/api/v1/users/gus", json={"unix_user": "gus.y"}, headers=admin)
    assert r.status_code == 200 and r.json()["unix_user"] == "gus.y"
    assert r.json()["is_admin"] is False  # unchanged
    for bad in ("-x", "a b", "", "x" * 65, "../x"):
        r = api.client.patch("/api/v1/users/gus", json={"unix_user": bad}, headers=admin)
        assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "unix_user"]
        r = api.client.post("/api/v1/users", json={**body, "name": "h", "unix_user": bad},
                            headers=admin)  # fmt: skip
        assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "unix_user"]
    plain = api.client.patch("/api/v1/users/gus", json={"unix_user": "z"}, headers=api.as_("bob"))
    assert plain.status_code == 403
    audit = api.client.get("/api/v1/audit?action=user.unix_user", headers=admin).json()["items"]
    assert [(e["target"], e["info"]) for e in audit] == [
        ("gus", {"unix_user": {"from": "gus_x", "to": "gus.y"}})
    ]
