"""One time style in the CLI: local time with its zone, to the second, by default;
`gpusched --utc` prints UTC; --json keeps the API's ISO 8601 times. Run under a fixed
zone (Europe/Berlin), whatever the machine's."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest
from sqlalchemy import update

from app.cli.client import format_time, set_utc_output
from app.cli.jobs.views import reason_cell
from app.jobs.models import Job
from tests.cli.harness import Cli

# 2030-01-02 03:04:05 UTC is 04:04:05 in Berlin (CET, UTC+1); 2030-07-02 in summer, CEST.
WINTER = "2030-01-02T03:04:05Z"
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d")  # an ISO 8601 time, as the API writes it


@pytest.fixture
def berlin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
    set_utc_output(False)


@pytest.mark.usefixtures("berlin")
def test_format_time_is_local_with_its_zone_to_the_second_or_utc() -> None:
    assert format_time(WINTER) == "2030-01-02 04:04:05 CET"
    assert format_time("2030-07-02T03:04:05.123456+00:00") == "2030-07-02 05:04:05 CEST"
    assert format_time(datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2030-01-02 04:04:05 CET"
    # A window's or a batch's own zone, labelled.
    assert format_time(WINTER, zone="America/New_York") == "2030-01-01 22:04:05 EST"
    assert (format_time(None), format_time("soon")) == ("", "soon")
    set_utc_output(True)
    assert format_time(WINTER) == "2030-01-02 03:04:05 UTC"
    assert format_time(WINTER, zone="America/New_York") == "2030-01-02 03:04:05 UTC"


@pytest.mark.usefixtures("berlin")
def test_show_prints_local_times_with_the_zone_and_utc_with_the_global_option(cli: Cli) -> None:
    submitted = cli("submit", "--json", "--begin", WINTER, "--", "true")
    assert submitted.exit_code == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["id"]

    local = cli("show", str(job_id))
    assert local.exit_code == 0, local.stderr
    assert "at 2030-01-02 04:04:05 CET" in local.stdout  # the schedule
    assert re.search(r"created\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d CES?T\s*\n", local.stdout)
    assert not ISO.search(local.stdout), local.stdout  # events' times too

    utc = cli.raw(["--utc", "show", "--url", cli.url, "--token", cli.tokens["alice"], str(job_id)])
    assert utc.exit_code == 0, utc.stderr
    assert "at 2030-01-02 03:04:05 UTC" in utc.stdout
    assert re.search(r"created\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\s*\n", utc.stdout)
    assert " CET" not in utc.stdout and not ISO.search(utc.stdout)

    # Machine-readable output keeps the API's ISO 8601 with offset.
    raw = json.loads(cli("show", "--json", str(job_id)).stdout)
    assert datetime.fromisoformat(raw["schedule"]["at"]) == datetime(
        2030, 1, 2, 3, 4, 5, tzinfo=UTC
    )


@pytest.mark.usefixtures("berlin")
def test_a_reason_time_is_data_the_cli_formats(cli: Cli) -> None:
    job_id = json.loads(cli("submit", "--json", "--begin", WINTER, "--", "true").stdout)["id"]
    # What a cycle writes for it (tests/cycle/test_deep_queue.py has the cycle do it).
    with cli.factory() as session:
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(
                pending_reason="begin_time",
                pending_message="begin time not reached",
                estimated_start_at=datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC),
            )
        )
        session.commit()
    job = json.loads(cli("show", "--json", str(job_id)).stdout)
    assert (job["pending_message"], job["pending_until"]) == (
        "begin time not reached",
        "2030-01-02T03:04:05Z",
    )
    line = "begin time not reached; waits until 2030-01-02 04:04:05 CET"
    assert line in cli("show", str(job_id)).stdout
    assert line in cli("jobs").stdout
    assert reason_cell(job) == line


@pytest.mark.usefixtures("berlin")
def test_window_list_labels_the_window_zone(cli: Cli) -> None:
    night = {"name": "night", "timezone": "Europe/Berlin",
             "daily": [{"start": "22:00", "end": "06:00"}]}  # fmt: skip
    admin = {"Authorization": f"Bearer {cli.tokens['admin']}"}
    httpx.post(f"{cli.url}/api/v1/windows", json=night, headers=admin).raise_for_status()
    listed = cli.raw(["window", "list", "--url", cli.url, "--token", cli.tokens["alice"]])
    assert listed.exit_code == 0, listed.stderr
    opening = r"\d{4}-\d\d-\d\d 22:00:00 (CES?T) - \d{4}-\d\d-\d\d 06:00:00 (CES?T)"
    assert re.search(opening, listed.stdout), listed.stdout
    connection = ["--url", cli.url, "--token", cli.tokens["alice"]]
    in_utc = cli.raw(["--utc", "window", "list", *connection])
    assert re.search(r"2\d:00:00 UTC - \d{4}-\d\d-\d\d 0\d:00:00 UTC", in_utc.stdout), in_utc.stdout
