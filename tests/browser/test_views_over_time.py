"""The dashboard's views over time (issue 36): the overview's range (1 h / 24 h / 7 d, the
past only), its running-jobs table and per-GPU heatmap; the job page's two charts, where a
finished job ran, and a requeue shown as one; the Submit form's working directory and
model (estimator) fields. Headless Chromium against the real stack."""

from __future__ import annotations

import contextlib
import re
import urllib.error
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from tests.browser.conftest import Dashboard, Stack
from tests.browser.test_dashboard import _expect_text, _submitted_job
from tests.support.wait import poll

pytestmark = pytest.mark.browser


def _cancel(stack: Stack, *jobs: dict[str, Any]) -> None:
    for job in jobs:
        with contextlib.suppress(urllib.error.HTTPError):
            stack.request("POST", f"/api/v1/jobs/{job['id']}/cancel?grace_s=0")


def _running(stack: Stack, name: str, gpus: int) -> dict[str, Any]:
    job = stack.request(
        "POST", "/api/v1/jobs", {"name": name, "command": "sleep 120", "gpus": gpus}
    )
    poll(
        f"{name} running",
        lambda: stack.request("GET", f"/api/v1/jobs/{job['id']}")["status"] == "RUNNING",
        timeout=60,
    )
    return job


@pytest.mark.parametrize("width", ["desktop", "phone"])
def test_the_overview_shows_the_past_running_jobs_and_each_gpu_over_time(
    width: str, dash: Dashboard, phone: Dashboard, stack: Stack
) -> None:
    view = dash if width == "desktop" else phone
    page = view.page
    asked: list[dict[str, list[str]]] = []
    page.on(
        "request",
        lambda r: (
            asked.append({"path": [urlparse(r.url).path], **parse_qs(urlparse(r.url).query)})
            if "/api/v1/utilization" in r.url
            else None
        ),
    )
    job = _running(stack, f"heat-{width}", gpus=2)
    try:
        view.login(stack.admin_token)
        row = f"#running-table tr[data-job='{job['id']}']"
        _expect_text(page, row, f"#{job['id']} heat-{width}")
        _expect_text(page, f"{row} td.mono", r"^sim-\d:\d, sim-\d:\d$")  # where it runs
        # The heatmap: a row per GPU of the two simulated nodes, with its mean.
        page.wait_for_selector("#gpu-heatmap canvas")
        page.wait_for_function(
            "() => document.querySelectorAll('#gpu-heatmap .hm-label').length === 8"
        )
        # A cell of the job's GPU names the job (on a phone there is no hover). The heatmap
        # is read once a minute: choosing the range again reads it now.
        if width == "desktop":
            placed = stack.request("GET", f"/api/v1/jobs/{job['id']}")["allocations"][0]
            labels = page.locator("#gpu-heatmap .hm-label").all_text_contents()
            first = next(i for i, t in enumerate(labels) if t.strip().startswith(placed["node"]))
            y_in_row = (first + placed["gpu_index"]) * 18 + 8  # rows of 16 px and a 2 px gap

            def hover_names_the_job() -> bool:
                page.click("[data-range='1h']")
                page.wait_for_load_state("networkidle")
                canvas = page.locator("#gpu-heatmap canvas")
                canvas.scroll_into_view_if_needed()  # below the fold with more jobs listed
                box = canvas.bounding_box()
                assert box is not None
                page.mouse.move(box["x"] + box["width"] - 2, box["y"] + y_in_row)  # now
                tip = page.locator("#heatmap-tip")
                pattern = rf"GPU {placed['gpu_index']}.*job #{job['id']}"
                return tip.is_visible() and bool(re.search(pattern, tip.text_content() or ""))

            poll(
                "the heatmap's cell of the job's GPU naming the job",
                hover_names_the_job,
                timeout=60,
            )
            _expect_text(page, "#gpu-heatmap .hm-mean", r"^\d+%$")
            view.shot("overview-heatmap-hover-desktop")
        view.shot(f"overview-1h-{width}")
        assert page.get_attribute("[data-range='1h']", "aria-pressed") == "true"

        # 7 days, the past only: the chart and the heatmap ask from a week ago to now.
        page.click("[data-range='7d']")
        _expect_text(page, "#heatmap-card h2", "^Utilisation per GPU, last 7 days$")
        assert page.get_attribute("[data-range='7d']", "aria-pressed") == "true"
        assert page.evaluate("location.hash") == "#/?range=7d"
        page.wait_for_function(
            "() => document.querySelectorAll('#gpu-heatmap .hm-label').length === 8"
        )
        week = [a for a in asked if a.get("step") == ["3600"]]
        assert {a["path"][0] for a in week} == {"/api/v1/utilization", "/api/v1/utilization/gpus"}
        since = min(datetime.fromisoformat(a["since"][0].replace("Z", "+00:00")) for a in week)
        back = (datetime.now(UTC) - since).total_seconds() - 7 * 86400
        assert 0 <= back < 3600 + 600  # a week, from the whole hour before
        page.wait_for_load_state("networkidle")
        view.shot(f"overview-7d-{width}")
        # The choice is kept: the overview opens on it again.
        view.go("#/queue")
        page.wait_for_selector("#pending, #active")
        view.go("#/")
        _expect_text(page, ".card h2", "^GPU utilisation, last 7 days$")
        assert page.get_attribute("[data-range='7d']", "aria-pressed") == "true"
        page.click("[data-range='1h']")
        _expect_text(page, ".card h2", "^GPU utilisation, last hour$")
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
        view.assert_clean()
    finally:
        _cancel(stack, job)


def test_a_job_page_charts_utilisation_and_memory_apart_and_says_where_it_ran(
    dash: Dashboard, stack: Stack, gate: Path
) -> None:
    # It runs until the test opens the gate: its running page is seen however slowly a
    # loaded machine renders it.
    command = f"while [ ! -e {gate} ]; do sleep 0.1; done"
    job = stack.request("POST", "/api/v1/jobs", {"name": "two-gpus", "command": command, "gpus": 2})
    page = dash.page
    dash.login(stack.admin_token)
    dash.go(f"#/jobs/{job['id']}")
    try:
        _expect_text(page, "#job-spec", "RUNNING", timeout=30_000)
        _expect_text(page, "#job-spec dt", "^Placed on$")
        _expect_text(page, "#job-placed", r"^sim-\d:\d, sim-\d:\d$")
        page.wait_for_selector("#job-chart canvas")
        page.wait_for_selector("#job-memory-chart canvas")
        # One point per sample time for its two GPUs (not a zigzag between them).
        merged = page.evaluate(
            """async () => {
              const { perSample } = await import('/js/pages/job.js');
              const at = '2026-11-26T10:00:00+00:00', next = '2026-11-26T10:00:05+00:00';
              return perSample([
                { at, resolution_s: 5, node: 'a', gpu_index: 0, util_pct: 80, memory_used_mb: 1000 },
                { at, resolution_s: 5, node: 'a', gpu_index: 1, util_pct: 40, memory_used_mb: 3000 },
                { at: next, resolution_s: 5, node: 'a', gpu_index: 0, util_pct: 90, memory_used_mb: 1000 },
              ]);
            }"""
        )
        assert [(p["util_pct"], p["memory_used_mb"]) for p in merged] == [(60, 4000), (90, 1000)]
        gate.touch()
        _expect_text(page, "#job-spec", "SUCCEEDED", timeout=40_000)
        # Ended: where it ran, not "Placed on" with a dash.
        _expect_text(page, "#job-spec dt", "^Ran on$")
        _expect_text(page, "#job-placed", r"^sim-\d:\d, sim-\d:\d$")
        page.wait_for_timeout(300)
        dash.shot("job-finished-two-charts-desktop")
        dash.assert_clean()
    finally:
        _cancel(stack, job)


def test_a_job_requeued_as_its_agent_stopped_is_not_shown_preempted(
    dash: Dashboard, phone: Dashboard, stack: Stack
) -> None:
    """As `systemctl stop gpusched-agent` leaves it: the agent stopped the job for its
    shutdown and reported it PREEMPTED, though nobody preempted it. The job is held so
    that nothing places it again while the page is looked at."""
    from sqlalchemy import select

    from app.db import make_engine, make_session_factory
    from app.jobs.agent_reports import job_finished
    from app.jobs.lifecycle import transition
    from app.jobs.models import Job
    from app.jobs.states import JobStatus
    from app.nodes.models import Allocation, Node
    from app.wire import Finished

    job = stack.request(
        "POST", "/api/v1/jobs", {"name": "on-a-stopping-node", "command": "true", "hold": True}
    )
    engine = make_engine(f"sqlite:///{stack.data_dir / 'gpusched.db'}")
    try:
        factory = make_session_factory(engine)
        with factory.begin() as session:
            row = session.scalar(select(Job).where(Job.id == job["id"]))
            row.attempt = 1
            transition(
                session,
                job=row,
                to=JobStatus.SCHEDULED,
                actor="scheduler",
                reason="placed on sim-1:0",
            )
            transition(
                session,
                job=row,
                to=JobStatus.RUNNING,
                actor="agent:sim-1",
                reason="started as pid 7",
            )
            # The node holds the attempt (a report from a node that does not is refused);
            # no GPU of it, so that no other test's placement can collide with this one.
            node = session.scalar(select(Node).where(Node.name == "sim-1"))
            session.add(Allocation(job_id=row.id, attempt=1, node_id=node.id, gpu_id=None))
        with factory.begin() as session:
            report = Finished(job_id=job["id"], attempt=1, node="sim-1", result="PREEMPTED",
                              message="exit code 0 after preempt")  # fmt: skip
            assert job_finished(session=session, report=report).accepted
    finally:
        engine.dispose()
    try:
        for view, width in ((dash, "desktop"), (phone, "phone")):
            page = view.page
            view.login(stack.admin_token)
            view.go(f"#/jobs/{job['id']}")
            _expect_text(
                page,
                "#job-events li[data-to=PENDING]",
                "^RUNNING → PENDING · requeued as its node's agent stopped "
                r"\(exit code 0 after preempt\); requeued: no retry spent",
            )
            assert page.locator("#job-events li[data-to=PREEMPTED]").count() == 0
            assert "PREEMPTED" not in (page.text_content("#job-events") or "")
            view.shot(f"job-requeued-at-shutdown-{width}")
            view.assert_clean()
    finally:
        _cancel(stack, job)


@pytest.mark.parametrize("width", ["desktop", "phone"])
def test_submit_with_a_working_directory_and_a_model_instead_of_memory(
    width: str, dash: Dashboard, phone: Dashboard, stack: Stack
) -> None:
    view = dash if width == "desktop" else phone
    view.console.allow(422, r"/api/v1/jobs$")
    page = view.page
    view.login(stack.admin_token)
    view.go("#/submit")
    page.fill("#f-name", f"model-{width}")
    page.fill("#f-command", "pwd")
    page.fill("#f-workdir", "/tmp")
    # A parameter count the form cannot read is said next to the field, nothing is sent.
    page.fill("#f-model_parameters", "seven billion")
    page.click("#estimate-model")
    _expect_text(page, "#err-model_parameters", "is not a parameter count: write 7B")
    # A model no GPU of the cluster holds: the server's advice, under the model fields.
    page.fill("#f-model_parameters", "400B")
    page.click("#submit-job")
    _expect_text(page, "#err-model", "needs .* MiB per GPU")
    assert page.locator("#form-success:not([hidden])").count() == 0
    # 350M parameters in mixed precision with Adam: an estimate, then the job asks for it.
    page.fill("#f-model_parameters", "350M")
    page.select_option("#f-model_optimizer", "adam")
    page.click("#estimate-model")
    _expect_text(page, "#model-estimate", r"^About \d+(\.\d)? GiB per GPU on 1 GPU")
    _expect_text(page, "#model-estimate li", "H100")
    page.wait_for_timeout(200)
    view.shot(f"submit-model-{width}")
    page.click("#submit-job")
    job_id = _submitted_job(page)
    try:
        job = stack.request("GET", f"/api/v1/jobs/{job_id}")
        assert job["workdir"] == "/tmp"
        assert job["gpu_memory_mb"] and job["gpu_memory_mb"] > 1024  # filled from the estimate
        page.click("#job-link")
        _expect_text(page, "#job-log", r"^/tmp\s*$", timeout=30_000)  # it ran there
        _expect_text(page, "#job-spec", "Workdir/tmp")
        view.assert_clean()
    finally:
        _cancel(stack, {"id": job_id})


def test_a_parameter_count_is_read_as_people_write_it(dash: Dashboard, stack: Stack) -> None:
    page = dash.page
    dash.login(stack.admin_token)
    counts = page.evaluate(
        """async () => {
          const { parseParameters } = await import('/js/pages/submit.js');
          const read = (t) => { try { return parseParameters(t); } catch (e) { return e.message; } };
          return ['7B', '1.3b', '350M', '125k', '7e9', '7000000000', '1_300_000', 'x', '0'].map(read);
        }"""
    )
    assert counts[:7] == [7e9, 1.3e9, 350e6, 125e3, 7e9, 7e9, 1.3e6]
    assert all(re.search("is not a parameter count", c) for c in counts[7:])
