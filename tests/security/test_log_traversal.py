"""The log endpoint serves the job's own attempt log and nothing else.

Canary files sit next to and above the log directory (tests/security/conftest.py); no
request, however its job id or attempt is spelled, may return one of them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.security.conftest import CANARY_TEXT, LOG_TEXT, Cluster

LOGS = "/api/v1/jobs/{}/logs"

BAD_JOB_IDS = [
    "0",
    "-1",
    "2147483648",  # one past the 32-bit id range
    "99999999999999999999999999999999",
    "1e3",
    "..",
    "%2e%2e",
    "%2e%2e%2f",
    "..%2f..%2fcanary.txt",
    "%2e%2e%2f%2e%2e%2fcanary.txt",
    "%2F..%2F..%2Fcanary.txt",
    "%2Fetc%2Fpasswd",
    "%00",
    "1%00",
    "1%2f..%2f..%2fcanary.txt",
    "canary.log",
    "~",
    "%252e%252e%252f",  # double-encoded
]

BAD_ATTEMPTS = [
    "0",
    "-1",
    "2",  # the job has one attempt so far
    "10001",
    "99999999999999999999999999999999",
    "1.5",
    "..",
    "../canary.log",
    "..%2f..%2fcanary.txt",
    "%2e%2e%2f%2e%2e%2fcanary.txt",
    "/etc/passwd",
    "1/../../canary.txt",
    "1%00",
    "",
]


def _assert_no_canary(r) -> None:
    assert CANARY_TEXT not in r.text, (r.request.url, r.status_code)


@pytest.mark.parametrize("job_id", BAD_JOB_IDS)
def test_bad_job_id_is_404_or_422_never_another_file(cluster: Cluster, job_id: str) -> None:
    r = cluster.api.client.get(LOGS.format(job_id), headers=cluster.headers("alice"))
    assert r.status_code in (404, 422), (job_id, r.status_code, r.text[:300])
    _assert_no_canary(r)


@pytest.mark.parametrize("attempt", BAD_ATTEMPTS)
def test_bad_attempt_is_404_or_422_never_another_file(cluster: Cluster, attempt: str) -> None:
    url = LOGS.format(cluster.ml_running_job) + f"?attempt={attempt}"
    r = cluster.api.client.get(url, headers=cluster.headers("alice"))
    assert r.status_code in (404, 422), (attempt, r.status_code, r.text[:300])
    _assert_no_canary(r)


@pytest.mark.parametrize(
    "raw_path",
    [
        "/api/v1/jobs/../../canary.txt/logs",
        "/api/v1/jobs/1/../../../canary.txt",
        "/api/v1/jobs/1/logs/../../../../canary.txt",
        "/api/v1/jobs/1/logs/..%2f..%2fcanary.txt",
    ],
)
def test_dot_segments_in_the_raw_path_never_reach_a_file(cluster: Cluster, raw_path: str) -> None:
    """Sent byte for byte (no client-side dot-segment removal) through the ASGI app."""
    client = cluster.api.client
    request = client.build_request("GET", "http://testserver/", headers=cluster.headers("alice"))
    request.url = request.url.copy_with(raw_path=raw_path.encode())
    r = client.send(request)
    assert r.status_code in (404, 405, 422), (raw_path, r.status_code, r.text[:300])
    _assert_no_canary(r)


def test_the_real_log_is_served_and_tail_bounds_hold(cluster: Cluster) -> None:
    api, job = cluster.api, cluster.ml_running_job
    r = api.client.get(LOGS.format(job), headers=cluster.headers("alice"))
    assert r.status_code == 200 and r.text == LOG_TEXT
    for tail in ("0", "-1", "10001", "99999999999999999999", "1;cat"):
        r = api.client.get(LOGS.format(job) + f"?tail={tail}", headers=cluster.headers("alice"))
        assert r.status_code == 422, (tail, r.text)
    # Another project's job: refused, and its log is not served.
    r = api.client.get(LOGS.format(job), headers=cluster.headers("bob"))
    assert r.status_code == 403 and LOG_TEXT not in r.text


def test_dashboard_static_files_stay_inside_the_frontend_dir(cluster: Cluster) -> None:
    client = cluster.api.client
    for raw in (
        "/../pyproject.toml",
        "/..%2fpyproject.toml",
        "/%2e%2e/pyproject.toml",
        "/%2e%2e%2fpyproject.toml",
        "/../../etc/passwd",
        "/..%2f..%2f..%2f..%2f..%2fetc%2fpasswd",
        "/%2e%2e/app/config.py",
    ):
        request = client.build_request("GET", "http://testserver/")
        request.url = request.url.copy_with(raw_path=raw.encode())
        r = client.send(request)
        assert "[build-system]" not in r.text and "root:" not in r.text, raw
        assert "pydantic_settings" not in r.text, raw


def test_a_log_replaced_by_a_symlink_is_not_followed(cluster: Cluster) -> None:
    """A job runs as the agent's user by default and can find its log file: if it replaces
    it with a symlink, the API must not serve the link's target (e.g. data_dir/admin.token)."""
    log = cluster.settings.log_dir.resolve() / str(cluster.ml_running_job) / "attempt-1.log"
    canary: Path = cluster.canaries[0]
    log.unlink()
    os.symlink(canary, log)
    r = cluster.api.client.get(
        LOGS.format(cluster.ml_running_job), headers=cluster.headers("alice")
    )
    _assert_no_canary(r)


def test_a_job_cannot_serve_another_file_as_its_log(cluster: Cluster) -> None:
    from tests.agent.support import installation_of
    from workers.agent.fence import choose_fence
    from workers.agent.runner import JobLaunch, start_job

    canary = cluster.canaries[0]
    log = cluster.settings.log_dir.resolve() / str(cluster.ml_running_job) / "attempt-1.log"
    # The job runs as the agent's user here (single-user): it may replace its own log.
    swap = f'ln -s {canary} "{log}.lnk" && mv -f "{log}.lnk" "{log}"'
    process = start_job(
        JobLaunch(
            command=swap,
            workdir=cluster.settings.data_dir,
            job_id=cluster.ml_running_job,
            attempt=1,
            log_path=log,
            grace_s=1.0,
        ),
        fence=choose_fence(installation_of(cluster.settings.data_dir), "n1"),
    )
    outcome = process.wait(20)
    assert outcome is not None and outcome.exit_code == 0
    r = cluster.api.client.get(
        LOGS.format(cluster.ml_running_job), headers=cluster.headers("alice")
    )
    assert r.status_code in (200, 404)
    _assert_no_canary(r)
