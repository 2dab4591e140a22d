"""Polling with ETags: an unchanged listing costs a 304 with no body."""


def test_unchanged_json_is_a_304_and_a_change_is_a_new_etag(api):
    headers = api.as_("alice")
    first = api.client.get("/api/v1/queues", headers=headers)
    etag = first.headers["etag"]
    assert first.status_code == 200 and first.headers["cache-control"] == "private, no-cache"
    again = api.client.get("/api/v1/queues", headers={**headers, "If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    api.client.post("/api/v1/jobs", json={"command": ["x"]}, headers=headers)
    changed = api.client.get("/api/v1/queues", headers={**headers, "If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["etag"] != etag
    assert changed.json()[0]["pending"] == 1


def test_errors_and_plain_text_carry_no_etag(api):
    assert "etag" not in api.client.get("/api/v1/queues").headers  # 401
    job = api.client.post("/api/v1/jobs", json={"command": ["x"]}, headers=api.as_("alice")).json()
    logs = api.client.get(f"/api/v1/jobs/{job['id']}/logs", headers=api.as_("alice"))
    assert logs.status_code == 200 and "etag" not in logs.headers
