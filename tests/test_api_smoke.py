def test_submit_and_get(api):
    r = api.client.post(
        "/api/v1/jobs", json={"command": ["echo", "hi"], "gpus": 1}, headers=api.as_("alice")
    )
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["status"] == "PENDING" and body["project"] == "ml" and body["name"] == "echo"
    r = api.client.get(f"/api/v1/jobs/{body['id']}", headers=api.as_("alice"))
    assert r.status_code == 200
