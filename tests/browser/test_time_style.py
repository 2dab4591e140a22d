"""One time style on the dashboard, the CLI's: the browser's local time, 24-hour, to the
second, with the zone named; a reason's time (pending_until) formatted in that style."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.browser.conftest import Dashboard, Stack
from tests.support.wait import poll

pytestmark = pytest.mark.browser

# 03:04:05 UTC on 2 January is 04:04:05 in Berlin (UTC+1); en-US names the zone GMT+1.
BEGIN = "2030-01-02T03:04:05Z"
BERLIN_BEGIN = "2030-01-02 04:04:05 GMT+1"
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d GMT\+1"
TWELVE_HOUR = re.compile(r"\d\d?:\d\d(:\d\d)?\s?[AP]M\b")


def _text(page: Any, selector: str) -> str:
    return str(page.inner_text(selector))


def test_times_and_a_reasons_time_show_local_with_the_zone(berlin: Dashboard, stack: Stack) -> None:
    body = {"name": "later", "command": "true", "gpus": 1, "schedule": {"mode": "at", "at": BEGIN}}
    job = stack.request("POST", "/api/v1/jobs", body)
    # The scheduler's cycle gives it its reason, with the time as data.
    waiting = poll(
        "the begin-time reason",
        lambda: (
            (j := stack.request("GET", f"/api/v1/jobs/{job['id']}"))["pending_reason"]
            == "begin_time"
            and j
        ),
        timeout=30,
    )
    assert waiting["pending_message"] == "begin time not reached"
    assert waiting["pending_until"] == BEGIN

    page = berlin.page
    berlin.login(stack.admin_token)
    berlin.go(f"#/jobs/{job['id']}")
    page.wait_for_selector("#job-reason")
    reason = _text(page, "#job-reason")
    assert f"begin time not reached; waits until {BERLIN_BEGIN}" in reason
    details = _text(page, "main")
    assert f"at {BERLIN_BEGIN}" in details  # the schedule
    assert re.search(rf"Submitted\s+{STAMP}", details), details
    assert not TWELVE_HOUR.search(details), details
    berlin.shot("time-style-job-berlin")

    berlin.go("#/queue")
    page.wait_for_selector(f"text=waits until {BERLIN_BEGIN}")
    assert not TWELVE_HOUR.search(_text(page, "main"))
    berlin.shot("time-style-queue-berlin")
    stack.request("POST", f"/api/v1/jobs/{job['id']}/cancel")
    berlin.assert_clean()
