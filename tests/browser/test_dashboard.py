"""The dashboard in headless Chromium against the real stack with simulated GPUs."""

from __future__ import annotations

import contextlib
import json
import re
import urllib.error
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import Dashboard, Stack
from tests.notifications.receiver import Receiver
from tests.support.wait import poll

pytestmark = pytest.mark.browser

PAGES = [
    ("overview", "#/", "#gpu-stats .stat"),
    ("queue", "#/queue", "#pending, #active"),
    ("nodes", "#/nodes", ".gpu"),
    ("windows", "#/windows", "#windows h2"),
    ("submit", "#/submit", "#submit-form"),
    ("audit", "#/audit", "#audit-table"),
    ("users", "#/users", "#users-table"),
]


def _expect_text(page: Any, selector: str, pattern: str, timeout: float = 20_000) -> None:
    page.wait_for_function(
        "([sel, pat]) => [...document.querySelectorAll(sel)].some(e => new RegExp(pat).test(e.textContent))",
        arg=[selector, pattern],
        timeout=timeout,
    )


def _submitted_job(page: Any) -> int:
    """The id of the job the submit form just made, from its link."""
    link = page.wait_for_selector("#job-link")
    return int(re.search(r"/jobs/(\d+)", link.get_attribute("href") or "").group(1))  # type: ignore[union-attr]


def test_login_rejects_a_bad_token_then_accepts_the_admin(dash: Dashboard, stack: Stack) -> None:
    dash.console.allow(401, r"/api/v1/me")
    page = dash.page
    page.goto(stack.url + "/")
    page.fill("#token", "gps_not-a-real-token")
    page.click("button[type=submit]")
    _expect_text(page, "#login-error", "not valid")
    assert page.evaluate("sessionStorage.getItem('gpusched.token')") is None

    dash.login(stack.admin_token)
    _expect_text(page, "#who-name", "admin")
    page.wait_for_selector("#gpu-stats .stat")
    dash.assert_clean()


def test_a_revoked_session_returns_to_login_with_a_message(dash: Dashboard, stack: Stack) -> None:
    dash.console.allow(401, r"/api/v1/")
    page = dash.page
    dash.login(stack.admin_token)
    # The token stops working while the page is open (e.g. revoked): the next poll is a 401.
    page.evaluate("sessionStorage.setItem('gpusched.token', 'gps_revoked')")
    page.wait_for_selector("#token", timeout=15_000)
    _expect_text(page, "#login-error", "Sign in again")
    dash.assert_clean()


def test_a_multi_node_jobs_page_shows_each_nodes_log(dash: Dashboard, stack: Stack) -> None:
    body = {"name": "two-nodes", "command": "echo from node $NODE_RANK", "gpus": 1, "nodes": 2}
    job = stack.request("POST", "/api/v1/jobs", body)
    page = dash.page
    dash.login(stack.admin_token)
    dash.go(f"#/jobs/{job['id']}")
    _expect_text(page, "#job-log", "from node 0", timeout=30_000)
    page.select_option("#log-node", "1")
    _expect_text(page, "#job-log", "from node 1")
    dash.shot("job-two-nodes")
    page.select_option("#log-node", "all")  # as gpusched logs --label
    _expect_text(page, "#job-log", "^0: from node 0\n1: from node 1\n$")
    dash.shot("job-all-nodes")
    dash.assert_clean()


def test_a_jobs_page_shows_the_script_it_runs(dash: Dashboard, stack: Stack) -> None:
    # As `gpusched submit sweep.sh 0.1` sends it: the script's text at submission.
    script = '#!/bin/sh\n#SBATCH -J sweep\necho "lr=$1 from $(basename "$0")"\n'
    body = {"command": ["./sweep.sh", "0.1"], "script": script, "workdir": "/tmp", "gpus": 1}
    job = stack.request("POST", "/api/v1/jobs", body)
    page = dash.page
    dash.login(stack.admin_token)
    dash.go(f"#/jobs/{job['id']}")
    _expect_text(page, "#job-log", "lr=0.1 from sweep.sh", timeout=30_000)
    _expect_text(
        page, "#job-script", re.escape(f"runs its script as submitted ({len(script)} bytes)")
    )
    page.click("#job-script-toggle")
    _expect_text(page, "#job-script-text", "#SBATCH -J sweep")
    dash.shot("job-script")
    page.click("#job-script-toggle")
    page.wait_for_selector("#job-script-text", state="detached")
    dash.assert_clean()


def test_submit_through_the_form_then_follow_the_job(
    dash: Dashboard, stack: Stack, gate: Path
) -> None:
    page = dash.page
    dash.login(stack.admin_token)
    dash.go("#/submit")
    page.fill("#f-name", "browser-hello")
    # It runs until the test opens the gate: it is seen in the queue however slowly a
    # loaded machine renders the page.
    page.fill("#f-command", f"echo hello-from-job; while [ ! -e {gate} ]; do sleep 0.1; done")
    page.fill("#f-env", "GREETING=hi")
    page.fill("#f-labels", "suite=browser")
    page.fill("#f-grace_s", "120")
    page.fill("#f-exclude_nodes", "sim-1")  # as sbatch --exclude
    page.click("#submit-job")
    job_id = _submitted_job(page)

    # The job shows up in the queue: pending with its reason, or already in the active list.
    dash.go("#/queue")
    page.wait_for_selector(f"tr[data-job='{job_id}']", timeout=30_000)
    row = page.locator(f"tr[data-job='{job_id}']").first
    assert "browser-hello" in (row.text_content() or "")
    if page.locator(f"#pending-table tr[data-job='{job_id}']").count():
        assert (row.locator("td.reason").text_content() or "").strip() not in ("", "—")
    else:
        assert re.search(r"RUNNING|SCHEDULED", row.text_content() or "")

    # The detail page shows the spec, the timeline and the log once it ran.
    link_in_queue = page.locator(f"a[href='#/jobs/{job_id}']")
    if link_in_queue.count():
        link_in_queue.first.click()
    else:
        dash.go(f"#/jobs/{job_id}")
    page.wait_for_selector("#job-command")
    assert "echo hello-from-job" in (page.text_content("#job-command") or "")
    _expect_text(page, "#job-log", "hello-from-job", timeout=30_000)
    _expect_text(page, "#job-events", "RUNNING")
    gate.touch()
    _expect_text(page, "#job-spec", "SUCCEEDED", timeout=30_000)
    spec = page.text_content("#job-spec") or ""
    assert "GREETING=hi" in spec
    assert "2m 00s from SIGTERM to SIGKILL, to checkpoint" in spec
    _expect_text(page, "#job-node-choice", "^excludes sim-1$")
    _expect_text(page, "#job-events", "placed on sim-2")
    _expect_text(page, "#job-spec dt", "^Ran on$")  # ended: where it ran
    _expect_text(page, "#job-placed", r"^sim-2:\d$")
    dash.assert_clean()


def test_invalid_input_shows_the_servers_message_next_to_the_field(
    dash: Dashboard, stack: Stack
) -> None:
    dash.console.allow(422, r"/api/v1/jobs$")
    page = dash.page
    dash.login(stack.admin_token)
    dash.go("#/submit")
    page.fill("#f-command", "true")
    page.fill("#f-gpus", "-1")
    page.click("#submit-job")
    error = page.wait_for_selector("#err-gpus:not([hidden])")
    assert "greater than or equal to 0" in (error.text_content() or "")
    assert page.get_attribute("#f-gpus", "aria-invalid") == "true"
    # The message sits inside the gpus field, not in a banner at the top.
    assert page.locator("[data-field='gpus'] .field-error").is_visible()
    assert page.locator("#form-error").is_hidden()

    # A bad env line is caught before sending, next to its field too.
    page.fill("#f-gpus", "1")
    page.fill("#f-env", "no equals sign")
    page.click("#submit-job")
    page.wait_for_selector("#err-env:not([hidden])")
    assert page.locator("#err-gpus").is_hidden()

    # A node name that does not exist, with the ones that do.
    page.fill("#f-env", "")
    page.fill("#f-only_nodes", "sim-9")
    page.click("#submit-job")
    _expect_text(page, "#err-only_nodes", "^no node named sim-9; nodes: sim-1, sim-2$")
    _expect_text(page, "#help-only_nodes", "nodes: sim-1, sim-2$")
    # This stack allows notifications to 127.0.0.1 only: another host is refused, saying why.
    page.fill("#f-only_nodes", "")
    page.fill("#f-notify_url", "http://hooks.example.org/hook")
    page.select_option("#f-notify_on", "fail")
    page.click("#submit-job")
    _expect_text(
        page,
        "#err-notify_url",
        r"^host hooks.example.org is not allowed here \(allowed: 127.0.0.1\)$",
    )
    dash.assert_clean()


def test_a_jobs_page_tells_how_its_notifications_went(dash: Dashboard, stack: Stack) -> None:
    receiver = Receiver()
    try:
        page = dash.page
        dash.login(stack.admin_token)
        dash.go("#/submit")
        page.fill("#f-name", "browser-notified")
        page.fill("#f-command", "true")
        page.fill("#f-notify_url", receiver.url)
        page.select_option("#f-notify_on", "end")
        page.click("#submit-job")
        link = page.wait_for_selector("#job-link")
        link.click()
        _expect_text(page, "#job-notify", "when it ends")
        # Sent by the scheduler's beat within seconds of the end; the page keeps polling.
        _expect_text(page, "#job-notifications", r"^end · delivered ", timeout=30_000)
        assert [b["event"] for b in receiver.bodies] == ["end"]
        dash.shot("job-notifications")
        dash.assert_clean()
    finally:
        receiver.server.shutdown()


def test_notify_me_without_a_url_uses_the_users_default(dash: Dashboard, stack: Stack) -> None:
    default = "http://127.0.0.1:9/default-hook"
    stack.request("PATCH", "/api/v1/me", {"notify_url": default})
    try:
        page = dash.page
        dash.login(stack.admin_token)
        dash.go("#/submit")
        assert default in (page.get_attribute("#f-notify_url", "placeholder") or "")
        page.fill("#f-name", "browser-default-hook")
        page.fill("#f-command", "true")
        page.check("#f-notify")
        page.select_option("#f-notify_on", "fail")
        page.click("#submit-job")
        job_id = _submitted_job(page)
        job = stack.request("GET", f"/api/v1/jobs/{job_id}")
        assert (job["notify_url"], job["notify_on"]) == (default, ["fail"])
        dash.assert_clean()
    finally:
        stack.request("PATCH", "/api/v1/me", {"notify_url": None})


def test_submit_held_and_after_another_job_through_the_form(dash: Dashboard, stack: Stack) -> None:
    dash.console.allow(422, r"/api/v1/jobs(/\d+)?$")
    page = dash.page
    dash.login(stack.admin_token)

    def submit(name: str) -> int:
        page.fill("#f-name", name)
        page.click("#submit-job")
        return _submitted_job(page)

    dash.go("#/submit")
    page.fill("#f-command", "true")
    page.check("#f-hold")
    train = submit("form-train")
    page.uncheck("#f-hold")
    # Not a job id: caught before sending. A job that does not exist: the server's 422.
    for typed, message in (("12, x", '"x" is not a job id'), ("999999", "no job 999999")):
        page.fill("#f-depends_on", typed)
        page.click("#submit-job")
        _expect_text(page, "#err-depends_on:not([hidden])", message)
    page.fill("#f-depends_on", str(train))
    evaluate = submit("form-eval")
    page.select_option("#f-dependency", "after")  # a monitor: once train has started
    monitor = submit("form-monitor")

    dash.go(f"#/jobs/{monitor}")
    _expect_text(
        page, "#job-reason", f"^dependency waiting for job {train} [(]form-train[)] to start$"
    )
    assert (page.text_content("#job-depends-on") or "") == f"#{train} (must start)"
    dash.go(f"#/jobs/{train}")
    _expect_text(page, "#job-reason", "^held held by admin")
    dash.go(f"#/jobs/{evaluate}")
    _expect_text(
        page, "#job-reason", f"^dependency waiting for job {train} [(]form-train[)] to succeed$"
    )
    assert (page.text_content("#job-depends-on") or "") == f"#{train} (must succeed)"
    dash.shot("job-dependency-desktop")
    # Change it (scontrol update): the server's refusal next to its field, then a change.
    page.click("#change-job")
    page.fill("#c-priority", "5000")
    page.click("#save-change")
    _expect_text(page, "#cerr-priority:not([hidden])", "less than or equal to 1000")
    dash.shot("job-change-desktop")
    page.fill("#c-priority", "7")
    page.fill("#c-grace_s", "60")
    page.click("#save-change")
    _expect_text(page, "#job-events li", "updated by admin: priority 0 -> 7, grace_s None -> 60")
    assert page.locator("#job-change").is_hidden()
    # The dependency is cancelled: the next cycle cancels this job, which could never start.
    stack.request("POST", f"/api/v1/jobs/{train}/cancel")
    _expect_text(page, "#job-spec", "CANCELLED", timeout=20_000)
    _expect_text(page, "#job-events li", "dependency never satisfied")

    # One at a time (singleton): the second waits for the first of its name, held here.
    dash.go("#/submit")
    page.fill("#f-command", "true")
    page.check("#f-singleton")
    page.fill("#f-depends_on", str(train))  # a singleton names no jobs: the server's 422
    page.click("#submit-job")
    _expect_text(page, "#err-depends_on:not([hidden])", "a singleton job names no jobs")
    page.fill("#f-depends_on", "")
    page.check("#f-hold")
    first = submit("form-nightly")
    page.uncheck("#f-hold")
    second = submit("form-nightly")
    dash.go(f"#/jobs/{second}")
    _expect_text(
        page,
        "#job-reason",
        f"waiting for job {first} [(]form-nightly[)] to end: one job named 'form-nightly' at a time$",
    )
    assert (page.text_content("#job-depends-on") or "") == (
        "singleton: one job named form-nightly of admin's at a time"
    )
    dash.assert_clean()


def test_change_what_a_pending_job_waits_for(dash: Dashboard, stack: Stack) -> None:
    """scontrol update Dependency= from the job's page: the server's refusal by its field,
    another kind, then none."""
    dash.console.allow(422, r"/api/v1/jobs/\d+$")
    held = {"command": "true", "gpus": 0, "hold": True}
    train = stack.request("POST", "/api/v1/jobs", {**held, "name": "dep-train"})["id"]
    evaluate = stack.request(
        "POST", "/api/v1/jobs", {**held, "name": "dep-eval", "depends_on": [train]}
    )["id"]
    page = dash.page
    dash.login(stack.admin_token)
    dash.go(f"#/jobs/{evaluate}")
    _expect_text(page, "#job-depends-on", f"#{train} [(]must succeed[)]")
    page.click("#change-job")
    assert page.input_value("#c-depends_on") == str(train)
    page.fill("#c-depends_on", f"{train}, {evaluate}")
    page.click("#save-change")
    _expect_text(page, "#cerr-depends_on:not([hidden])", f"job {evaluate} cannot wait for itself")
    dash.shot("job-change-dependency-desktop")
    page.fill("#c-depends_on", str(train))
    page.select_option("#c-dependency", "afterany")
    page.click("#save-change")
    _expect_text(
        page,
        "#job-events li",
        f"updated by admin: dependency afterok:{train} -> afterany:{train}",
    )
    _expect_text(page, "#job-depends-on", f"#{train} [(]must end[)]")
    page.click("#change-job")
    page.fill("#c-depends_on", "")
    page.click("#save-change")
    _expect_text(page, "#job-events li", f"dependency afterany:{train} -> none")
    dash.assert_clean()
    for job in (train, evaluate):
        stack.request("POST", f"/api/v1/jobs/{job}/cancel")


def test_a_jobs_page_keeps_its_buttons_across_refreshes(dash: Dashboard, stack: Stack) -> None:
    """The page refreshes every 2 s; a head rebuilt at each refresh replaced the button
    under a pointer between its press and release, and the click was lost (seen under
    load). Nothing changed, so the same buttons stay; a change rebuilds them."""
    job = stack.request(
        "POST", "/api/v1/jobs", {"command": "true", "gpus": 0, "hold": True, "name": "still"}
    )["id"]
    page = dash.page
    dash.login(stack.admin_token)
    dash.go(f"#/jobs/{job}")
    _expect_text(page, "#change-job", "^Change$")
    page.evaluate("() => { window.changeButton = document.querySelector('#change-job'); }")

    def refreshed() -> None:
        # Two reads of the job: the refresh after the first one has rendered by the second.
        for _ in range(2):
            with page.expect_response(
                lambda r: r.request.method == "GET" and r.url.endswith(f"/api/v1/jobs/{job}"),
                timeout=30_000,
            ):
                pass

    refreshed()
    assert page.evaluate("() => window.changeButton.isConnected")
    stack.request("POST", f"/api/v1/jobs/{job}/release")
    refreshed()
    assert not page.evaluate("() => window.changeButton.isConnected")
    dash.assert_clean()


def test_submit_an_array_and_a_cleanup_step_through_the_form(dash: Dashboard, stack: Stack) -> None:
    dash.console.allow(422, r"/api/v1/jobs$")
    page = dash.page
    dash.login(stack.admin_token)
    dash.go("#/submit")
    page.fill("#f-command", "true")
    page.fill("#f-name", "form-sweep")
    page.check("#f-hold")  # held: nothing runs, the test only looks
    page.fill("#f-max_running", "2")
    page.click("#submit-job")  # tasks at once, but no array: caught before sending
    _expect_text(page, "#err-max_running:not([hidden])", "only for an array")
    page.fill("#f-array", "5-1")
    page.click("#submit-job")  # the server's refusal, next to the field
    _expect_text(page, "#err-array:not([hidden])", "range '5-1' ends before it starts")
    page.fill("#f-array", "0-2")
    page.click("#submit-job")
    _expect_text(page, "#form-success", r"^Array #\d+ submitted: 3 jobs")
    dash.shot("submit-array-desktop")
    link = page.get_attribute("#job-link", "href") or ""
    first = int(re.search(r"/jobs/(\d+)", link).group(1))  # type: ignore[union-attr]

    page.fill("#f-name", "form-cleanup")
    page.fill("#f-array", "")
    page.fill("#f-max_running", "")
    page.fill("#f-depends_on", str(first))
    page.select_option("#f-dependency", "afterany")
    page.click("#submit-job")
    _expect_text(page, "#form-success", r"^Job #\d+ submitted")
    page.click("#job-link")
    # Depending on an array's id waits for all of its tasks; however they end.
    _expect_text(page, "#job-depends-on", rf"^#{first}, #{first + 1}, #{first + 2} [(]must end[)]$")
    dash.assert_clean()


def test_an_array_shows_its_tasks_and_why_the_rest_wait(dash: Dashboard, stack: Stack) -> None:
    first = stack.request(
        "POST",
        "/api/v1/jobs",
        {
            "name": "sweep",
            # Longer than the test on a loaded machine: task 0 ending would start task 1
            # (its page then offers a placed job's changes) and leave it SUCCEEDED.
            "command": "sleep 3600",
            "gpus": 1,
            "project": "default",
            "array": {"indices": "0-2", "max_running": 1},
        },
    )
    page = dash.page
    dash.login(stack.admin_token)
    try:
        dash.go("#/queue")
        # Task 0 runs; the others wait outside the queue for its one slot: not yet
        # eligible, in their own section below the jobs that may run.
        _expect_text(page, "#later-table td", r"^sweep\[2\]$")
        _expect_text(page, "#later-table .reason", "array limit")
        dash.shot("queue-array-desktop")
        # Hold and release from the queue, as scontrol hold/release.
        last = first["id"] + 2
        page.click(f'#later-table [data-hold="{last}"]')
        _expect_text(page, f'#later-table tr[data-job="{last}"] .reason', "^held")
        page.click(f'#later-table [data-release="{last}"]')
        _expect_text(page, f'#later-table tr[data-job="{last}"] .reason', "^array limit")
        dash.go(f"#/jobs/{first['id'] + 1}")
        _expect_text(page, "h1", r"^sweep\[1\]")
        _expect_text(
            page, "#job-array", f"^task 1 of array #{first['id']} [(]3 tasks, at most 1 at once[)]$"
        )
        _expect_text(page, "#job-reason", "waiting for one of its tasks to end")
        dash.shot("job-array-desktop")
        # Hold the array's waiting tasks in one request (task 0, running, cannot be), then
        # release them: the button follows the task's state.
        poll(
            "task 0 running",
            lambda: stack.request("GET", f"/api/v1/jobs/{first['id']}")["status"] == "RUNNING",
            timeout=30,
        )
        page.click(f'[data-hold-array="{first["id"]}"]')
        _expect_text(page, "#toast", f"^Array {first['id']}: 2 tasks held$")
        _expect_text(page, "#job-reason", "held by admin")
        assert stack.request("GET", f"/api/v1/jobs/{last}")["held_by"] == "admin"
        page.click(f'[data-release-array="{first["id"]}"]')
        _expect_text(page, "#toast", f"^Array {first['id']}: 2 tasks released$")
        _expect_text(page, f'[data-hold-array="{first["id"]}"]', "^Hold array$")
        assert stack.request("GET", f"/api/v1/jobs/{last}")["held_by"] is None
        # One change for every pending task of the array, as scontrol update of its id.
        page.click("#change-job")
        page.fill("#c-priority", "5")
        page.check("#c-all-tasks")
        page.click("#save-change")
        _expect_text(page, "#toast", f"^2 pending tasks of array {first['id']} changed$")
        priorities = [
            stack.request("GET", f"/api/v1/jobs/{first['id'] + i}")["priority"] for i in range(3)
        ]
        assert priorities == [0, 5, 5]  # task 0 runs
        # A pending task's Change panel also changes its array's limit.
        dash.console.allow(422, r"/api/v1/jobs/\d+/array$")  # the 0 refused below
        page.click("#change-job")
        page.fill("#c-max_running", "0")
        page.click("#save-change")
        _expect_text(page, "#cerr-max_running:not([hidden])", "greater than or equal to 1")
        dash.shot("job-array-change-desktop")
        page.fill("#c-max_running", "2")
        page.click("#save-change")
        _expect_text(page, "#job-array", "[(]3 tasks, at most 2 at once[)]$")
        assert stack.request("GET", f"/api/v1/jobs/{first['id']}")["array"]["max_running"] == 2
        # Cancel the whole array from any task's page, in one request (scancel of an array).
        page.click(f'[data-cancel-array="{first["id"]}"]')
        page.click(f'[data-cancel-array="{first["id"]}"]')  # confirm
        # The second task may have started under the new limit: cancelled or stopping.
        _expect_text(
            page, "#toast", f"^Array {first['id']}: (1 task|2 tasks) cancelled, [12] stopping$"
        )
        for offset in range(3):
            task = first["id"] + offset
            poll(
                f"task {task} cancelled",
                lambda task=task: (
                    stack.request("GET", f"/api/v1/jobs/{task}")["status"] == "CANCELLED"
                ),
                timeout=30,
            )
        dash.assert_clean()
    finally:
        for offset in range(3):
            stack.request("POST", f"/api/v1/jobs/{first['id'] + offset}/cancel")


def test_a_job_stuck_in_its_grace_period_is_killed_from_its_page(
    dash: Dashboard, stack: Stack
) -> None:
    job = stack.request(
        "POST",
        "/api/v1/jobs",
        {
            "name": "stubborn",
            "command": "trap '' TERM; echo ignoring-sigterm; sleep 300 & wait",
            "gpus": 1,
            "project": "default",
            "grace_s": 300,
        },
    )
    page = dash.page
    dash.login(stack.admin_token)
    try:
        dash.go(f"#/jobs/{job['id']}")
        _expect_text(page, "#job-log", "ignoring-sigterm", timeout=30_000)
        page.click(f'[data-cancel="{job["id"]}"]')
        page.click(f'[data-cancel="{job["id"]}"]')  # confirm
        # SIGTERM is ignored and 5 minutes of grace remain: it says so, and offers a kill.
        page.wait_for_selector(f'[data-kill="{job["id"]}"]', timeout=10_000)
        _expect_text(page, ".stopping", "stopping…")
        assert stack.request("GET", f"/api/v1/jobs/{job['id']}")["status"] == "RUNNING"
        dash.shot("job-stopping-desktop")
        page.click(f'[data-kill="{job["id"]}"]')
        _expect_text(page, "#job-spec", "CANCELLED", timeout=20_000)
        _expect_text(page, "#job-events", "cancel again [(]SIGKILL now[)]")
        dash.assert_clean()
    finally:
        stack.request("POST", f"/api/v1/jobs/{job['id']}/cancel?grace_s=0")


def test_a_running_jobs_time_limit_is_changed_from_its_page(dash: Dashboard, stack: Stack) -> None:
    job = stack.request(
        "POST",
        "/api/v1/jobs",
        {"name": "long-run", "command": "sleep 300", "gpus": 1, "project": "default",
         "max_runtime_s": 3600},
    )  # fmt: skip
    page = dash.page
    dash.login(stack.admin_token)
    try:

        def ran_3_s() -> bool:
            started = stack.request("GET", f"/api/v1/jobs/{job['id']}")["started_at"]
            return bool(started) and datetime.now(UTC) - datetime.fromisoformat(
                started
            ) > timedelta(seconds=3)

        poll("running for 3 s", ran_3_s, timeout=30)
        dash.go(f"#/jobs/{job['id']}")
        page.click("#change-job")
        # Placed: only its time limit (scontrol update TimeLimit=).
        page.wait_for_selector("#c-max_runtime_s")
        assert page.locator("#c-priority, #c-depends_on").count() == 0
        dash.console.allow(422, rf"/api/v1/jobs/{job['id']}$")
        page.fill("#c-max_runtime_s", "2")  # it has run longer
        page.click("#save-change")
        _expect_text(page, "#cerr-max_runtime_s", "would end it at once")
        page.fill("#c-max_runtime_s", "7200")
        dash.shot("job-running-change-desktop")
        page.click("#save-change")
        _expect_text(page, "#toast", f"^Job {job['id']} changed$")
        _expect_text(page, "#job-events", "max_runtime_s 3600 -> 7200")
        assert stack.request("GET", f"/api/v1/jobs/{job['id']}")["max_runtime_s"] == 7200
        dash.assert_clean()
    finally:
        stack.request("POST", f"/api/v1/jobs/{job['id']}/cancel?grace_s=0")


def test_a_running_job_is_requeued_from_its_page_and_the_queue(
    dash: Dashboard, stack: Stack, gate: Path
) -> None:
    job = stack.request(
        "POST",
        "/api/v1/jobs",
        {
            "name": "movable",
            # Its checkpoint lasts until the test opens the gate: it is seen stopping
            # however slowly a loaded machine renders the pages.
            "command": f"trap 'while [ ! -e {gate} ]; do sleep 0.1; done; exit 0' TERM; "
            "echo attempt-$GPUSCHED_ATTEMPT; sleep 300 & wait",
            "gpus": 1,
            "project": "default",
            "grace_s": 300,
        },
    )
    page = dash.page
    dash.login(stack.admin_token)
    try:
        dash.go(f"#/jobs/{job['id']}")
        _expect_text(page, "#job-log", "attempt-1", timeout=30_000)
        page.click(f'[data-requeue="{job["id"]}"]')
        _expect_text(page, f'[data-requeue="{job["id"]}"]', "^Confirm requeue$")
        page.click(f'[data-requeue="{job["id"]}"]')
        _expect_text(page, "#job-events", "requeue requested by admin; stopping the process")
        _expect_text(page, "#requeuing", "requeuing…")
        dash.go("#/queue")
        _expect_text(page, f"tr[data-job='{job['id']}']", "requeuing…")
        gate.touch()
        dash.go(f"#/jobs/{job['id']}")
        # Checkpointed and exited, back in the queue, placed again: attempt 2 runs.
        _expect_text(page, "#job-events", "exit code 0 after requeue", timeout=20_000)
        _expect_text(page, "#job-events", "requeued: no retry spent")
        # Its owner requeued it: one change back to the queue, not "PREEMPTED".
        _expect_text(
            page,
            "#job-events li[data-to=PENDING]",
            "^RUNNING → PENDING · exit code 0 after requeue; requeued: no retry spent",
        )
        assert page.locator("#job-events li[data-to=PREEMPTED]").count() == 0
        _expect_text(page, "#job-log", "attempt-2", timeout=30_000)
        dash.shot("job-requeued-desktop")
        # Also from the queue's running table.
        gate.unlink()
        dash.go("#/queue")
        row = f"#active-table tr[data-job='{job['id']}']"
        page.click(f'{row} [data-requeue="{job["id"]}"]')
        page.click(f'{row} [data-requeue="{job["id"]}"]')  # confirm
        _expect_text(page, row, "requeuing…")
        gate.touch()
        poll(
            "attempt 3 running",
            lambda: stack.request("GET", f"/api/v1/jobs/{job['id']}")["attempt"] == 3,
            timeout=40,
        )
        dash.assert_clean()
    finally:
        stack.request("POST", f"/api/v1/jobs/{job['id']}/cancel?grace_s=0")


def test_bob_sees_only_his_project(dash: Dashboard, stack: Stack) -> None:
    dash.console.allow(403, r"/api/v1/jobs/\d+$")
    admin_job = stack.request(
        "POST",
        "/api/v1/jobs",
        {
            "name": "admin-secret",
            "command": "sleep 1",
            "gpus": 0,
            "project": "default",
            "schedule": {"mode": "at", "at": "2099-01-01T00:00:00Z"},
        },
    )
    bob_job = stack.request(
        "POST",
        "/api/v1/jobs",
        {
            "name": "bob-visible",
            "command": "sleep 1",
            "gpus": 0,
            "schedule": {"mode": "at", "at": "2099-01-01T00:00:00Z"},
        },
        token=stack.bob_token,
    )
    page = dash.page
    dash.login(stack.bob_token)
    _expect_text(page, "#who-name", "bob")
    dash.go("#/queue")
    page.wait_for_selector(f"tr[data-job='{bob_job['id']}']")
    body = page.text_content("#app") or ""
    assert "bob-visible" in body
    assert "admin-secret" not in body
    assert page.locator(f"tr[data-job='{admin_job['id']}']").count() == 0
    # Overview: only project cv in the per-project table, with its held job counted apart.
    held = {"name": "bob-held", "command": "true", "gpus": 0, "hold": True}
    held_job = stack.request("POST", "/api/v1/jobs", held, token=stack.bob_token)
    dash.go("#/")
    page.wait_for_selector("#projects-table")
    projects = page.text_content("#projects-table") or ""
    assert "cv" in projects and "default" not in projects
    assert "(1 held)" in projects
    dash.shot("overview-held")
    stack.request("POST", f"/api/v1/jobs/{held_job['id']}/cancel", token=stack.bob_token)
    # Its fair-share standing (as sshare): its part of the weights, and of recent use.
    assert "Share / use" in projects
    share = page.locator("#projects-table tbody tr td").nth(5).text_content() or ""
    assert re.fullmatch(r"\d+% / (\d+%|\u2013)", share), share  # en dash: no use yet
    assert page.locator("[data-edit-project]").count() == 0  # project settings: admins'
    # The admin's job page is "not found" for bob; no drain buttons for a non-admin.
    dash.go(f"#/jobs/{admin_job['id']}")
    _expect_text(page, "#job-missing h1", "not visible to you")
    dash.go("#/nodes")
    page.wait_for_selector(".gpu")
    assert page.locator("[data-drain], [data-undrain]").count() == 0
    # The audit trail is the admins': no link, and the page says so if typed in.
    assert page.locator("[data-nav=audit]").is_hidden()
    users_nav = page.locator("[data-nav=users]")
    assert users_nav.count() == 1 and users_nav.is_hidden()
    dash.console.allow(403, r"/api/v1/audit")
    dash.go("#/audit")
    _expect_text(page, "#audit-denied", "Only admins see the audit trail")
    dash.assert_clean()
    for job in (admin_job, bob_job):
        with contextlib.suppress(urllib.error.HTTPError):
            stack.request("POST", f"/api/v1/jobs/{job['id']}/cancel")


def test_an_admin_changes_a_projects_quota_and_time_limit(dash: Dashboard, stack: Stack) -> None:
    (before,) = [q for q in stack.request("GET", "/api/v1/queues") if q["project"] == "cv"]
    page = dash.page
    dash.login(stack.admin_token)
    dash.go("#/")
    try:
        page.click("[data-edit-project='cv']")
        page.fill("#p-gpu_quota", "-1")
        dash.console.allow(422, r"/api/v1/projects/cv$")
        page.click("#save-project")
        _expect_text(page, "#perr-gpu_quota", "greater than or equal to 0")
        page.fill("#p-gpu_quota", "2")
        page.fill("#p-max_runtime_s", "3600")
        dash.shot("overview-project-editor-desktop")
        page.click("#save-project")
        _expect_text(page, "#toast", "^Project cv changed$")
        page.wait_for_selector("#project-editor", state="hidden")
        (cv,) = [q for q in stack.request("GET", "/api/v1/queues") if q["project"] == "cv"]
        assert (cv["gpu_quota"], cv["weight"], cv["max_runtime_s"]) == (2, before["weight"], 3600)
        _expect_text(page, "#projects-table tbody tr", "^cv.*2")
        # Cleared: the cluster's limit again.
        page.click("[data-edit-project='cv']")
        assert page.input_value("#p-max_runtime_s") == "3600"
        page.fill("#p-max_runtime_s", "")
        page.click("#save-project")
        # Saved once the form closes (the toast on screen may still be the last save's).
        page.wait_for_selector("#project-editor", state="hidden")
        assert [
            q["max_runtime_s"]
            for q in stack.request("GET", "/api/v1/queues")
            if q["project"] == "cv"
        ] == [None]
        dash.assert_clean()
    finally:
        stack.request(
            "PATCH",
            "/api/v1/projects/cv",
            {"gpu_quota": before["gpu_quota"], "max_runtime_s": before["max_runtime_s"]},
        )


def test_queue_paginates_on_the_server(dash: Dashboard, stack: Stack) -> None:
    """60 future jobs: the page holds 50 rows and pages through the rest."""
    ids = [
        stack.request(
            "POST",
            "/api/v1/jobs",
            {
                "name": f"later-{i}",
                "command": "true",
                "gpus": 1,
                "priority": i % 3,
                "schedule": {"mode": "at", "at": "2099-01-01T00:00:00Z"},
            },
        )["id"]
        for i in range(60)
    ]
    page = dash.page
    dash.login(stack.admin_token)
    dash.go("#/queue")
    # Begin-time jobs cannot run yet: they page in their own section, after the jobs that
    # may run (none here).
    page.wait_for_selector("#later-range")
    _expect_text(page, "#pending-total", r"^\(0\)$")
    assert page.locator("#later-table tbody tr").count() == 50
    page.click("#later-next")
    _expect_text(page, "#later-range", r"^51\u2013")
    assert 1 <= page.locator("#later-table tbody tr").count() <= 50
    # Cancel from the queue: the button asks for a second click, then the row goes.
    first = page.locator("#later-table tbody tr").first
    victim = first.get_attribute("data-job")
    first.locator("[data-cancel]").click()
    _expect_text(page, f"tr[data-job='{victim}'] [data-cancel]", "Confirm")
    page.click(f"tr[data-job='{victim}'] [data-cancel]")
    page.wait_for_selector(f"tr[data-job='{victim}']", state="detached")
    assert stack.request("GET", f"/api/v1/jobs/{victim}")["status"] == "CANCELLED"
    # Filter by name, as squeue --name: one job of the 60, and the filter is in the URL.
    page.fill("#filter-name", "later-7")
    page.press("#filter-name", "Enter")
    _expect_text(page, "#later-total", r"^\(1\)$")
    assert page.locator("#later-table tbody tr").count() == 1
    assert page.locator(f"#later-table tr[data-job='{ids[7]}']").count() == 1
    assert "name=later-7" in page.evaluate("window.location.hash")
    dash.shot("queue-filtered-by-name")
    page.fill("#filter-name", "")
    page.press("#filter-name", "Enter")
    # Filter by status: only the active list remains.
    page.select_option("#filter-status", "RUNNING")
    page.wait_for_selector("#pending", state="hidden")
    dash.assert_clean()
    for job_id in ids:
        stack.request("POST", f"/api/v1/jobs/{job_id}/cancel")  # idempotent


def test_a_waiting_jobs_page_says_why_the_jobs_ahead_go_first(
    dash: Dashboard, stack: Stack
) -> None:
    # Two jobs that wait for GPUs: every node drained (a job waiting for its begin time is
    # not in the queue yet, and has no rank).
    nodes = [n["name"] for n in stack.request("GET", "/api/v1/nodes")]
    for node in nodes:
        stack.request("POST", f"/api/v1/nodes/{node}/drain", {"reason": "rank test"})
    later = {"command": "true", "gpus": 1}
    first = stack.request("POST", "/api/v1/jobs", {**later, "name": "rank-first", "priority": 5})
    asked = stack.request("POST", "/api/v1/jobs", {**later, "name": "rank-asked", "priority": -5})
    try:
        page = dash.page
        dash.login(stack.admin_token)
        dash.go(f"#/jobs/{asked['id']}")
        # Ranked once the scheduler has run a cycle with it (every 2 s at most).
        _expect_text(page, "#job-rank", r"\d+ by a higher priority.*policy default", timeout=30_000)
        dash.shot("job-rank")
        dash.assert_clean()
    finally:
        for job in (first, asked):
            stack.request("POST", f"/api/v1/jobs/{job['id']}/cancel")
        for node in nodes:
            stack.request("POST", f"/api/v1/nodes/{node}/undrain")


def test_an_admin_adds_a_user_changes_its_projects_and_tokens(
    dash: Dashboard, stack: Stack
) -> None:
    dash.console.allow(422, r"/api/v1/users$")
    page = dash.page
    dash.login(stack.admin_token)
    dash.go("#/users")
    page.wait_for_selector("#users-table")
    # The server's 422 under its field.
    page.fill("#u-name", "erin")
    page.click("#create-user")
    _expect_text(page, "#err-u-projects", "at least 1 item")
    page.fill("#u-projects", "ml, vision")
    page.click("#create-user")
    token = page.wait_for_selector("#token-value").input_value()
    assert token.startswith("gps_")
    me = stack.request("GET", "/api/v1/me", token=token)
    assert (me["name"], me["projects"]) == ("erin", ["ml", "vision"])
    row = "tr[data-user='erin']"
    _expect_text(page, f"{row} td", "^1$")  # one active token
    dash.shot("users")

    page.fill(f"{row} [data-join]", "nlp")
    page.press(f"{row} [data-join]", "Enter")
    page.wait_for_selector(f"{row} [data-project='nlp']")
    page.click(f"{row} [aria-label='Remove erin from vision']")
    page.wait_for_selector(f"{row} [data-project='vision']", state="detached")
    page.click(f"{row} [data-new-token]")
    _expect_text(page, f"{row} td", "^2$")
    page.click(f"{row} [data-revoke]")
    _expect_text(page, f"{row} [data-revoke]", "Confirm")
    page.click(f"{row} [data-revoke]")
    _expect_text(page, f"{row} td", "^0$")

    # Roles: the only admin has no button (it stays one); erin becomes a second admin.
    assert page.locator("[data-role='admin']").count() == 0
    page.click(f"{row} [data-role]")
    _expect_text(page, f"{row} [data-role]", "Confirm make admin")
    page.click(f"{row} [data-role]")
    _expect_text(page, f"{row} [data-role]", "^Make user$")
    page.wait_for_selector("[data-role='admin']")  # either admin may step down now
    users = {u["name"]: u for u in stack.request("GET", "/api/v1/users")}
    assert (users["erin"]["projects"], users["erin"]["active_tokens"]) == (["ml", "nlp"], 0)
    assert users["erin"]["is_admin"] is True
    dash.shot("users-roles")
    dash.assert_clean()


def test_the_drain_form_fits_a_phone(phone: Dashboard, stack: Stack) -> None:
    phone.login(stack.admin_token)
    phone.go("#/nodes")
    phone.page.click("[data-drain='sim-2']")
    form = phone.page.locator("[data-node='sim-2'] .drain-form")
    assert form.locator("input[name=requeue]").is_visible()
    box = form.bounding_box()
    assert box is not None and box["x"] + box["width"] <= 390  # nothing off screen
    phone.shot("nodes-drain-phone")
    phone.page.click("[data-node='sim-2'] .drain-form button[type=button]")  # Cancel
    phone.assert_clean()


def test_drain_and_undrain_a_node_as_admin(dash: Dashboard, stack: Stack) -> None:
    # Two whole-node jobs: one runs on each of the two nodes.
    jobs = [
        stack.request(
            "POST",
            "/api/v1/jobs",
            {"name": f"whole-{i}", "command": "sleep 300", "gpus": 4, "project": "default"},
        )
        for i in range(2)
    ]
    page = dash.page
    dash.login(stack.admin_token)
    try:

        def both_running() -> list[dict] | None:
            found = [stack.request("GET", f"/api/v1/jobs/{j['id']}") for j in jobs]
            return found if all(j["status"] == "RUNNING" for j in found) else None

        running = poll("both jobs running", both_running, timeout=30)
        on_sim2 = next(j for j in running if j["allocations"][0]["node"] == "sim-2")
        dash.go("#/nodes")
        page.click("[data-drain='sim-2']")
        page.fill("[data-node='sim-2'] .drain-form input[type=text]", "browser test")
        page.check("[data-node='sim-2'] .drain-form input[name=requeue]")
        dash.shot("nodes-drain-desktop")
        page.click("[data-node='sim-2'] .drain-form button[type=submit]")
        page.wait_for_selector("[data-undrain='sim-2']")
        _expect_text(page, "[data-node='sim-2']", "drained: browser test")
        _expect_text(page, "#toast", "sim-2 drained; 1 running job[(]s[)] requeued")
        # Stopped and back in the queue; nowhere to run until the node is back.
        path = f"/api/v1/jobs/{on_sim2['id']}"
        poll(
            "back in the queue",
            lambda: stack.request("GET", path)["status"] == "PENDING",
            timeout=30,
        )
        page.click("[data-undrain='sim-2']")
        page.wait_for_selector("[data-drain='sim-2']")
        poll("placed again", lambda: stack.request("GET", path)["attempt"] == 2, timeout=30)
        dash.assert_clean()
    finally:
        for job in jobs:
            stack.request("POST", f"/api/v1/jobs/{job['id']}/cancel?grace_s=0")


def test_remove_a_node_whose_agent_has_stopped(dash: Dashboard, stack: Stack) -> None:
    from app.db import make_engine, make_session_factory
    from app.nodes.models import NodeState
    from tests.foundation.builders import add_node

    engine = make_engine(f"sqlite:///{stack.data_dir / 'gpusched.db'}")
    try:  # a node decommissioned with its agent: NOT_READY, holding nothing
        add_node(make_session_factory(engine), "old-1", gpus=2, state=NodeState.NOT_READY)
    finally:
        engine.dispose()
    page = dash.page
    # The page's timers on a clock of the test's: the 4 s poll and the 4 s window of an
    # armed button fire when the test says, not when a busy machine gets to them.
    page.clock.install()
    dash.login(stack.admin_token)
    dash.go("#/nodes")
    page.wait_for_selector("[data-remove='old-1']")
    # Nodes whose agents run cannot be removed: no button on them.
    assert page.locator("[data-remove='sim-1'], [data-remove='sim-2']").count() == 0

    # The next poll's answer held back until the button is armed: the redraw comes inside
    # the button's 4 s, and the second click must still confirm.
    held: list[Any] = []
    page.route("**/api/v1/nodes", lambda route: held.append(route))
    page.clock.pause_at(page.evaluate("Date.now()") + 1000)
    page.clock.run_for(4000)  # the poll is due within 4 s
    while not held:
        page.wait_for_timeout(50)
    shown = page.text_content(".page-head .sub")
    page.click("[data-remove='old-1']")
    _expect_text(page, "[data-remove='old-1']", "Confirm remove")
    dash.shot("nodes-remove-armed")
    held[0].continue_()
    page.unroute("**/api/v1/nodes")
    page.wait_for_function(
        "shown => document.querySelector('.page-head .sub').textContent !== shown", arg=shown
    )
    _expect_text(page, "[data-remove='old-1']", "Confirm remove")
    page.click("[data-remove='old-1']")
    _expect_text(page, "#toast", "old-1 removed; its agent registering again brings it back")
    page.wait_for_selector("[data-node='old-1']", state="detached")
    assert [n["name"] for n in stack.request("GET", "/api/v1/nodes")] == ["sim-1", "sim-2"]
    dash.assert_clean()


def test_plan_and_call_off_a_maintenance_from_the_drain_form(dash: Dashboard, stack: Stack) -> None:
    page = dash.page
    dash.login(stack.admin_token)
    dash.go("#/nodes")
    page.click("[data-drain='sim-2']")
    form = "[data-node='sim-2'] .drain-form"
    page.fill(f"{form} input[type=text]", "driver upgrade")
    tomorrow = (datetime.now() + timedelta(days=1)).strftime("%Y-%m-%dT09:00")  # local time
    page.fill(f"{form} input[name=at]", tomorrow)
    page.click(f"{form} button[type=submit]")
    page.wait_for_selector("[data-maintenance='sim-2']")
    _expect_text(page, "#toast", "^sim-2 maintenance from ")
    _expect_text(
        page,
        "[data-node='sim-2'] .node-meta",
        "maintenance from .*, until then only jobs whose time limit ends by then: driver upgrade",
    )
    node = stack.request("GET", "/api/v1/nodes/sim-2")
    planned = datetime.fromisoformat(node["maintenance_at"])
    assert node["drained"] is False
    assert planned == datetime.fromisoformat(tomorrow).astimezone()  # the browser's zone
    dash.shot("nodes-maintenance-desktop")
    page.click("[data-undrain='sim-2']")  # "Call off maintenance"
    page.wait_for_selector("[data-drain='sim-2']")
    assert stack.request("GET", "/api/v1/nodes/sim-2")["maintenance_at"] is None
    dash.assert_clean()


@pytest.fixture(scope="module")
def demo_schedule(stack: Stack) -> Iterator[None]:
    """An off-peak window and a batch, so the timeline and the chart band have content.
    Tolerant: the windows and batches APIs are younger than the dashboard."""
    bodies = [
        (
            "/api/v1/windows",
            {"name": "nightly", "timezone": "UTC", "daily": [{"start": "22:00", "end": "06:00"}]},
        ),
        (
            "/api/v1/windows",
            {
                "name": "lunch",
                "timezone": "UTC",
                "daily": [
                    {"start": "12:00", "end": "13:30", "days": ["mon", "tue", "wed", "thu", "fri"]}
                ],
            },
        ),
        (
            "/api/v1/batches",
            {
                "name": "nightly-eval",
                "cron": "0 2 * * *",
                "target": "offpeak",
                "window": "nightly",
                "concurrency": "forbid",
                "templates": [{"name": "eval", "command": "python eval.py", "gpus": 1}],
            },
        ),
    ]
    for path, body in bodies:
        try:
            stack.request("POST", path, body)
        except urllib.error.HTTPError as exc:
            if exc.code not in (404, 405, 409):
                raise
    # GPU 3 of each node runs a process the scheduler did not start; GPU 2 fell off the bus.
    stack.sim_state.write_text(
        json.dumps(
            {
                "foreign": {"3": [{"pid": 4242, "util_pct": 35.0, "memory_mb": 12000}]},
                "failed": {"2": "XID 79: GPU has fallen off the bus"},
            }
        )
    )
    yield
    stack.sim_state.unlink(missing_ok=True)


def test_run_a_batch_now_and_read_its_firing_history(dash: Dashboard, stack: Stack) -> None:
    # Its job runs for minutes, so it has not ended when the batch is run again.
    template = {"name": "eval", "command": "sleep 300", "gpus": 1, "project": "default"}
    stack.request(
        "POST",
        "/api/v1/batches",
        {
            "name": "weekly-eval",
            "cron": "0 3 * * 0",
            "concurrency": "forbid",
            "templates": [template],
        },
    )
    page = dash.page
    dash.login(stack.admin_token)
    dash.go("#/windows")
    page.click("[data-history='weekly-eval']")
    _expect_text(page, "[data-firings='weekly-eval']", "^No firings yet[.]$")
    page.click("[data-run='weekly-eval']")
    _expect_text(page, "#toast", r"^weekly-eval: job \d+ submitted$")
    _expect_text(page, "table[data-firings='weekly-eval'] tbody tr", r"#\d+run by admin$")
    job_id = int(page.inner_text("table[data-firings='weekly-eval'] a").lstrip("#"))
    try:
        job = stack.request("GET", f"/api/v1/jobs/{job_id}")
        assert (job["name"], job["labels"]) == ("eval", {"batch": "weekly-eval"})
        dash.shot("windows-batch-run-desktop")
        # Its overlap policy is forbid: a second run waits for the first job to end.
        dash.console.allow(409, r"/api/v1/batches/weekly-eval/run$")
        page.click("[data-run='weekly-eval']")
        _expect_text(page, "#toast", f"^jobs {job_id} of an earlier firing have not ended")
        page.click("[data-disable='weekly-eval']")
        _expect_text(page, "#batches-table tbody tr", "^▾ weekly-eval.*disabled")
        assert stack.request("GET", "/api/v1/batches/weekly-eval")["enabled"] is False
        page.click("[data-enable='weekly-eval']")
        page.wait_for_selector("[data-disable='weekly-eval']")
        page.click(f"table[data-firings='weekly-eval'] a[href='#/jobs/{job_id}']")
        page.wait_for_selector("#job-command")
        dash.assert_clean()
    finally:
        stack.request("POST", f"/api/v1/jobs/{job_id}/cancel?grace_s=0")
        stack.request("DELETE", "/api/v1/batches/weekly-eval")


@pytest.mark.usefixtures("demo_schedule")
@pytest.mark.parametrize("width", ["desktop", "phone"])
def test_every_page_renders_without_console_errors(
    width: str, dash: Dashboard, phone: Dashboard, stack: Stack
) -> None:
    view = dash if width == "desktop" else phone
    page = view.page
    # Something to look at: a running job and a few waiting ones.
    running = stack.request(
        "POST",
        "/api/v1/jobs",
        {"name": "train-resnet", "command": "echo epoch 1; sleep 20", "gpus": 2},
    )
    waiting = stack.request(
        "POST",
        "/api/v1/jobs",
        {
            "name": "nightly-eval",
            "command": "python eval.py",
            "gpus": 4,
            "schedule": {"mode": "offpeak"},
        },
    )
    view.page.goto(stack.url + "/")
    page.wait_for_selector("#token")
    view.shot(f"login-{width}")
    view.login(stack.admin_token)
    view.go("#/nodes")
    page.wait_for_selector(".gpu[data-state=foreign]", timeout=20_000)
    page.wait_for_selector(".gpu[data-state=down]")
    assert page.locator("[data-foreign]").count() >= 1
    for name, route, ready in PAGES:
        view.go(route)
        page.wait_for_selector(ready)
        if name == "overview":  # the running job in its table, every GPU in the heatmap
            page.wait_for_selector(f"#running-table tr[data-job='{running['id']}']", timeout=30_000)
            page.wait_for_function("() => document.querySelectorAll('.hm-label').length >= 8")
        page.wait_for_load_state("networkidle")
        page.wait_for_timeout(300)
        view.shot(f"{name}-{width}")
        if name == "windows":  # the batch's concurrency, in words
            _expect_text(page, "#batches-table tbody tr", "^[▸▾] nightly-eval.*skip firing")
        if name == "overview":  # MiB from NVML shown in binary units, as on the chart's axis
            _expect_text(page, "[data-stat=util] .hint", r"^\d[\d,]* / \d[\d,]* GiB memory in use$")
    # The form with the server's errors next to the fields.
    view.console.allow(422, r"/api/v1/jobs$")
    view.go("#/submit")
    page.fill("#f-command", "true")
    page.fill("#f-gpus", "-1")
    page.fill("#f-gpu_share", "2")
    page.fill("#f-env", "CUDA_VISIBLE_DEVICES=0")
    page.click("#submit-job")
    page.wait_for_selector("#err-gpus:not([hidden])")
    view.shot(f"submit-errors-{width}")
    # (Not the off-peak job: the demo's nightly window may be open when this runs.)
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    later = stack.request(
        "POST",
        "/api/v1/jobs",
        {"command": "true", "gpus": 1, "schedule": {"mode": "at", "at": tomorrow}},
    )
    view.go(f"#/jobs/{later['id']}")
    _expect_text(page, "#job-log", "^The job has not started yet[.]$")
    # Hold keeps it from starting until Release (scontrol hold / release).
    page.click(f"[data-hold='{later['id']}']")
    _expect_text(page, "#job-reason", "^held held by admin: gpusched release")
    _expect_text(page, "#job-events li", "held by admin")  # who held it, in the timeline
    view.shot(f"job-held-{width}")
    page.click(f"[data-release='{later['id']}']")
    page.wait_for_selector(f"[data-hold='{later['id']}']")
    view.go(f"#/jobs/{running['id']}")
    page.wait_for_selector("#job-command")
    _expect_text(page, "#job-log", "epoch 1", timeout=20_000)
    page.wait_for_timeout(300)
    view.shot(f"job-{width}")
    # Pages are scrollable vertically only: nothing wider than the viewport.
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    # Every page link, the admin's Audit included, is on screen (not behind a hidden
    # horizontal scroll on a phone).
    off_screen = page.evaluate(
        "[...document.querySelectorAll('.nav a')].filter(a => a.getBoundingClientRect().right"
        " > window.innerWidth).map(a => a.textContent)"
    )
    assert off_screen == []
    view.go("#/logout-does-not-exist")
    page.wait_for_selector("text=Page not found")
    view.assert_clean()
    for job in (running, waiting, later):
        with contextlib.suppress(urllib.error.HTTPError):
            stack.request("POST", f"/api/v1/jobs/{job['id']}/cancel")


def test_endpoints_that_are_not_deployed_yet_degrade_gracefully(
    dash: Dashboard, stack: Stack
) -> None:
    """A server without /me, /windows/upcoming and job telemetry (answered 404 here)."""
    dash.console.allow(403, r"/api/v1/nodes/[^/]+/drain$")
    page = dash.page
    missing = r"/api/v1/(me|windows/upcoming|batches)(\?.*)?$|/api/v1/jobs/\d+/telemetry$"

    def not_found(route: Any) -> None:
        # As an older server without the endpoint answers (problem details, as every error).
        body = '{"type":"about:blank","title":"Not Found","status":404,"detail":"Not Found"}'
        route.fulfill(status=404, content_type="application/problem+json", body=body)

    page.route(re.compile(missing), not_found)
    dash.login(stack.bob_token)
    page.wait_for_selector("#gpu-stats .stat")
    _expect_text(page, "#window-note", "No off-peak windows configured")
    dash.go("#/windows")
    page.wait_for_selector("#no-windows")
    page.wait_for_selector("#no-batches")
    # Unknown role: the drain button is offered, and the server's 403 is explained.
    dash.go("#/nodes")
    page.click("[data-drain='sim-1']")
    page.click("[data-node='sim-1'] .drain-form button[type=submit]")
    _expect_text(page, "#toast", "Only admins")
    assert stack.request("GET", "/api/v1/nodes/sim-1")["drained"] is False
    # Job detail without telemetry: a note instead of the chart.
    job = stack.request(
        "POST",
        "/api/v1/jobs",
        {"name": "no-telemetry", "command": "true", "gpus": 0},
        token=stack.bob_token,
    )
    dash.go(f"#/jobs/{job['id']}")
    _expect_text(page, ".chart-legend", "not available")
    dash.assert_clean()


def test_an_admin_maps_a_user_to_a_unix_account_and_nodes_say_whose_jobs_run(
    dash: Dashboard, stack: Stack
) -> None:
    dash.console.allow(422, r"/api/v1/users$")
    page = dash.page
    dash.login(stack.admin_token)
    dash.go("#/users")
    page.wait_for_selector("#users-table")
    page.fill("#u-name", "ulla")
    page.fill("#u-projects", "ml")
    page.fill("#u-unix_user", "-rf")
    page.click("#create-user")
    _expect_text(page, "#err-u-unix_user", "is not a Unix account name")
    page.fill("#u-unix_user", "ulla_k")
    page.click("#create-user")
    page.wait_for_selector("#token-value")
    row = "tr[data-user='ulla']"
    field = page.locator(f"{row} [data-unix-user]")
    field.wait_for()
    assert field.input_value() == "ulla_k"
    field.fill("ulla.k")
    field.press("Enter")
    # The row is drawn again from the server's answer once the change is stored.
    page.wait_for_function(
        "() => document.querySelector(\"tr[data-user='ulla'] [data-unix-user]\")?.value === 'ulla.k'"
        " && !document.activeElement?.dataset?.unixUser"
    )
    users = {u["name"]: u for u in stack.request("GET", "/api/v1/users")}
    assert users["ulla"]["unix_user"] == "ulla.k"
    # Her pending-job limit: empty is the cluster's default.
    limit = page.locator(f"{row} [data-max-pending]")
    assert limit.input_value() == "" and limit.get_attribute("placeholder") == "default"
    limit.fill("250")
    limit.press("Enter")
    page.wait_for_function(
        "() => document.querySelector(\"tr[data-user='ulla'] [data-max-pending]\")?.value === '250'"
        " && !document.activeElement?.dataset?.maxPending"
    )
    users = {u["name"]: u for u in stack.request("GET", "/api/v1/users")}
    assert users["ulla"]["max_pending_jobs"] == 250
    # Her running limits (jobs at once, GPUs in use): empty is none.
    for key, attr, value in (("maxRunning", "max-running", "2"), ("maxGpus", "max-gpus", "4")):
        limit = page.locator(f"{row} [data-{attr}]")
        assert limit.input_value() == "" and limit.get_attribute("placeholder") == "none"
        limit.fill(value)
        limit.press("Enter")
        page.wait_for_function(
            f"() => document.querySelector(\"tr[data-user='ulla'] [data-{attr}]\")?.value === "
            f"'{value}' && !document.activeElement?.dataset?.{key}"
        )
    users = {u["name"]: u for u in stack.request("GET", "/api/v1/users")}
    assert (users["ulla"]["max_running_jobs"], users["ulla"]["max_gpus"]) == (2, 4)
    dash.shot("users-unix-account")

    dash.go("#/nodes")
    meta = page.locator("[data-isolation='sim-1']")
    meta.wait_for()
    node = stack.request("GET", "/api/v1/nodes/sim-1")
    assert f"isolation: {node['isolation']}" in meta.inner_text()
    assert "jobs run as their owners' Unix accounts" in meta.inner_text()  # `up` as root
    dash.assert_clean()
