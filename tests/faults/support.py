"""Helpers for the fault-injection suite: background traffic that records every status
code, job commands that leave start/end markers, invariant checks over the API, the job
events and the allocation rows, and a private PostgreSQL instance that may be stopped.

Everything is bounded by deadlines; the only sleeps are short polling intervals.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from tests.support.stack import Proc, Stack
from tests.support.wait import poll

ACTIVE_STATUSES = ("PENDING", "SCHEDULED", "RUNNING", "LOST", "PREEMPTED")
# What ends one attempt in the job's event history.
ATTEMPT_ENDS = frozenset(
    {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT", "PREEMPTED", "LOST", "PENDING"}
)

# Settings every fault stack uses on top of the e2e ones (tests.support.stack.tune_env):
# a short dispatch timeout so reconciliation re-sends lost run_job messages in test
# time, a short lease so a killed scheduler's lease expires quickly, and no metrics
# servers (two schedulers, and other suites' stacks, would fight over ports 9101/9102).
FAULT_ENV = {
    "GPUSCHED_SCHEDULER_DISPATCH_TIMEOUT_S": "3",
    "GPUSCHED_SCHEDULER_LEASE_TTL_S": "5",
    "GPUSCHED_SCHEDULER_METRICS_PORT": "0",
    "GPUSCHED_SCHEDULER_REPORTS_METRICS_PORT": "0",
}


def marker_command(runs: Path, seconds: float) -> str:
    """A job that appends `<job> <attempt> s|e <unix time> <node>` when it starts and
    ends: the ground truth of what really ran, independent of the database."""
    line = '"$GPUSCHED_JOB_ID $GPUSCHED_ATTEMPT {} $(date +%s.%N) $GPUSCHED_NODE"'
    return f"echo {line.format('s')} >> {runs}; sleep {seconds}; echo {line.format('e')} >> {runs}"


# -- processes --------------------------------------------------------------------------


def kill9(stack: Stack, label: str) -> Proc:
    """SIGKILL a stack process and its whole group (Celery beat is a child)."""
    proc = stack.procs[label]
    proc.expected_dead = True
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    assert proc.popen is not None
    proc.popen.wait(timeout=10)
    return proc


def restart(stack: Stack, label: str) -> Proc:
    old = stack.procs[label]
    return stack._spawn(label, old.argv, old.extra_env)


def spawn_extra(stack: Stack, label: str, like: str, argv: list[str] | None = None) -> Proc:
    """Another process like `like` (e.g. a second scheduler), under a new label."""
    old = stack.procs[like]
    return stack._spawn(label, argv or old.argv, old.extra_env)


def crashed(stack: Stack) -> list[str]:
    """'<label>: <why>' for each stack process that exited without a test killing it."""
    found = []
    for label, proc in stack.procs.items():
        if proc.expected_dead or proc.alive():
            continue
        text = proc.log.read_text(errors="replace")
        why = next(
            (line for line in reversed(text.splitlines()) if "Unrecoverable error" in line),
            f"exit code {proc.popen.returncode if proc.popen else '?'}",
        )
        found.append(f"{label}: {why.strip()}")
    return found


def wait_status_alive(stack: Stack, job_id: int, *statuses: str, timeout: float) -> dict[str, Any]:
    """Wait for a job status, failing at once if a stack process crashed meanwhile (a
    Redis outage must not kill a worker: see app/messaging.py)."""

    def probe() -> dict[str, Any] | None:
        assert not crashed(stack), crashed(stack)
        job = stack.job(job_id)
        return job if job["status"] in statuses else None

    return poll(f"job {job_id} to be {' or '.join(statuses)}", probe, timeout=timeout)


# -- traffic ----------------------------------------------------------------------------


@dataclass
class Traffic:
    """Submits a job every `interval` seconds from a thread (each with its own
    Idempotency-Key, re-sent with the same key until the API takes it) and probes
    /readyz and a read endpoint, recording every status code it sees."""

    stack: Stack
    spec: dict[str, Any]
    interval: float = 0.25
    limit: int = 1000
    ids: list[int] = field(default_factory=list)
    codes: list[tuple[float, str, int]] = field(default_factory=list)  # (t, what, status)
    readyz: list[tuple[float, int, dict[str, Any]]] = field(default_factory=list)
    errors: list[tuple[float, str, str]] = field(default_factory=list)
    replays: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _unsent: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Traffic:
        self._thread = threading.Thread(target=self._run, name="fault-traffic", daemon=True)
        self._thread.start()
        return self

    def stop(self, *, drain_timeout: float = 30.0) -> None:
        """Stop making new submissions; keep re-sending the refused ones until accepted."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with httpx.Client(base_url=self.stack.url, headers=self._headers(), timeout=10) as c:
            deadline = time.monotonic() + drain_timeout
            while self._unsent and time.monotonic() < deadline:
                self._send(c, self._unsent[0])
                if self._unsent:
                    time.sleep(0.2)
        assert not self._unsent, f"submissions never accepted: {self._unsent}"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.stack.token}"}

    def _send(self, client: httpx.Client, key: str) -> None:
        now = time.monotonic()
        try:
            r = client.post("/api/v1/jobs", json=self.spec, headers={"Idempotency-Key": key})
        except httpx.HTTPError as exc:
            self.errors.append((now, "submit", repr(exc)))
            return
        self.codes.append((now, "submit", r.status_code))
        if r.status_code in (200, 201):
            if r.status_code == 200:
                self.replays += 1
            with self._lock:
                job_id = r.json()["id"]
                if job_id not in self.ids:
                    self.ids.append(job_id)
                self._unsent.remove(key)

    def _run(self) -> None:
        with httpx.Client(base_url=self.stack.url, headers=self._headers(), timeout=10) as c:
            made = 0
            while not self._stop.is_set():
                started = time.monotonic()
                if made < self.limit:
                    key = f"fault-{uuid.uuid4().hex}"
                    self._unsent.append(key)
                    made += 1
                # Refused submissions are re-sent, oldest first, before the new one.
                for key in list(self._unsent):
                    self._send(c, key)
                    if key in self._unsent:
                        break
                for what, path in (("readyz", "/readyz"), ("list", "/api/v1/jobs?limit=5")):
                    try:
                        r = c.get(path)
                    except httpx.HTTPError as exc:
                        self.errors.append((time.monotonic(), what, repr(exc)))
                        continue
                    self.codes.append((time.monotonic(), what, r.status_code))
                    if what == "readyz":
                        with contextlib.suppress(ValueError):
                            self.readyz.append((time.monotonic(), r.status_code, r.json()))
                self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def server_errors(self) -> list[tuple[float, str, int]]:
        """Responses that say the server broke rather than a dependency is down."""
        return [c for c in self.codes if c[2] >= 500 and c[2] != 503]

    def codes_between(self, t0: float, t1: float) -> dict[tuple[str, int], int]:
        out: dict[tuple[str, int], int] = defaultdict(int)
        for t, what, code in self.codes:
            if t0 <= t <= t1:
                out[(what, code)] += 1
        return dict(out)


# -- waiting and checking ---------------------------------------------------------------


def list_jobs(stack: Stack, *statuses: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": 500}
    if statuses:
        params["status"] = list(statuses)
    while True:
        page = stack.api("GET", "/api/v1/jobs", params=params).json()
        items.extend(page["items"])
        if not page["next_cursor"]:
            return items
        params["cursor"] = page["next_cursor"]


def wait_settled(stack: Stack, *, timeout: float) -> list[dict[str, Any]]:
    """Until no job of the stack is pending, scheduled or running. Returns [] then, or the
    jobs still active once `timeout` seconds have passed with no change among them (none
    placed, started or ended): stuck, not merely slow. A loaded machine drains a backlog
    slowly, and that is no fault of the system under test."""
    seen: frozenset[tuple[Any, ...]] = frozenset()
    changed_at = time.monotonic()
    while True:
        stack._check_alive()
        active = list_jobs(stack, *ACTIVE_STATUSES)
        if not active:
            return []
        now = frozenset((j["id"], j["status"], j["attempt"]) for j in active)
        if now != seen:
            seen, changed_at = now, time.monotonic()
        elif time.monotonic() - changed_at >= timeout:
            return active
        time.sleep(0.25)


def wait_all_done(stack: Stack, *, timeout: float) -> float:
    """Like wait_settled, but raises when the jobs are stuck; returns when all ended."""
    stuck = wait_settled(stack, timeout=timeout)
    if stuck:
        raise TimeoutError(
            f"{len(stuck)} jobs active and unchanged for {timeout:.0f}s:\n"
            + describe_stuck(stack, stuck)
        )
    return time.monotonic()


def describe_stuck(stack: Stack, stuck: list[dict[str, Any]]) -> str:
    """Each job's status, why it waits and its latest event, then the stack's log tails."""
    lines = []
    for j in stuck[:30]:
        last = (stack.events(j["id"]) or [{}])[-1]
        lines.append(
            f"{j['id']}: {j['status']} attempt {j['attempt']} "
            f"{j.get('pending_reason')} {j.get('pending_message')}; last event "
            f"{last.get('at')} {last.get('to_status')} ({last.get('reason')})"
        )
    return "\n".join(lines) + "\n" + stack.tails(30)


def finished_but_stuck(stuck: list[dict[str, Any]], runs: Path) -> dict[int, list[str]] | None:
    """When every job still active really ran to its end (its marker says so), the system
    lost the report of that end: returns the marker lines per job; else None."""
    lines = runs.read_text().splitlines() if runs.exists() else []
    ran = {j["id"]: [r for r in lines if r.startswith(f"{j['id']} ")] for j in stuck}
    if stuck and all(any(" e " in r for r in rs) for rs in ran.values()):
        return ran
    return None


def probe_recovery(stack: Stack, since: float, *, timeout: float = 60.0) -> float:
    """Seconds from `since` (the moment the fault was repaired) until a job submitted
    now has run: the system does useful work again. The probe goes ahead of the test's
    traffic (an admin's top priority): on a loaded machine the backlog the outage left
    would otherwise be measured, not the recovery."""
    probe = {"command": "true", "gpus": 1, "priority": 1000}
    job = poll(
        "a submission to be accepted",
        lambda: (lambda r: r.json() if r.status_code == 201 else None)(
            stack.api("POST", "/api/v1/jobs", json=probe, check=False)
        ),
        timeout=timeout,
        interval=0.2,
    )
    stack.wait_status(job["id"], "SUCCEEDED", timeout=timeout, interval=0.1)
    return time.monotonic() - since


@dataclass
class Verdict:
    submitted: int
    lost: list[str]
    duplicated: list[str]
    gpu_overlaps: list[str]
    pending: int
    # Jobs whose command ran to its end more than once (at-least-once after a loss).
    reruns: dict[int, list[tuple[int, str, float, str]]] = field(default_factory=dict)

    def assert_clean(self, *, allow_reruns: bool = False) -> None:
        problems = []
        if self.reruns and not allow_reruns:
            problems.append(f"ran to the end more than once: {self.reruns}")
        if self.lost:
            problems.append(f"lost jobs: {self.lost}")
        if self.duplicated:
            problems.append(f"duplicated: {self.duplicated}")
        if self.gpu_overlaps:
            problems.append(f"GPU held by two jobs at once: {self.gpu_overlaps}")
        assert not problems, "\n".join(problems)


def _parse_at(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _attempt_overlaps(events: list[dict[str, Any]]) -> list[str]:
    """From a job's event history: no attempt N+1 RUNNING (or SCHEDULED) before attempt N
    ended, and no attempt RUNNING twice."""
    problems = []
    ended: dict[int, datetime] = {}
    running: dict[int, int] = defaultdict(int)
    for e in sorted(events, key=lambda e: e["id"]):
        attempt, to = e["attempt"], e["to_status"]
        at = _parse_at(e["at"])
        if to == "RUNNING":
            running[attempt] += 1
        if attempt >= 1 and to in ("SCHEDULED", "RUNNING") and attempt - 1 >= 1:
            prev_end = ended.get(attempt - 1)
            if prev_end is None:
                problems.append(f"attempt {attempt} {to} before attempt {attempt - 1} ended")
            elif at < prev_end:
                problems.append(f"attempt {attempt} {to} at {at} < end of {attempt - 1}")
        if to in ATTEMPT_ENDS and attempt >= 1 and attempt not in ended:
            ended[attempt] = at
    problems += [f"attempt {a} RUNNING {n} times" for a, n in running.items() if n > 1]
    return problems


def _marker_runs(runs: Path | None) -> dict[int, list[tuple[int, str, float, str]]]:
    out: dict[int, list[tuple[int, str, float, str]]] = defaultdict(list)
    if runs is None or not runs.exists():
        return out
    for line in runs.read_text().splitlines():
        parts = line.split()
        if len(parts) == 5:
            out[int(parts[0])].append((int(parts[1]), parts[2], float(parts[3]), parts[4]))
    return out


def gpu_overlaps(database_url: str) -> list[str]:
    """Whole-GPU allocation rows whose [created_at, released_at) intervals overlap."""
    from sqlalchemy import create_engine, text

    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT id, gpu_id, job_id, attempt, created_at, released_at FROM allocation "
                    "WHERE gpu_id IS NOT NULL AND share_milli = 1000 ORDER BY gpu_id, created_at"
                )
            ).all()
    finally:
        engine.dispose()
    by_gpu: dict[int, list[Any]] = defaultdict(list)
    for row in rows:
        by_gpu[row.gpu_id].append(row)
    found = []
    for gpu, allocs in by_gpu.items():
        for i, a in enumerate(allocs):
            for b in allocs[i + 1 :]:
                a_end, b_end = a.released_at, b.released_at
                if (b_end is None or a.created_at < b_end) and (
                    a_end is None or b.created_at < a_end
                ):
                    found.append(
                        f"gpu {gpu}: job {a.job_id}/{a.attempt} [{a.created_at}, {a_end}) and "
                        f"job {b.job_id}/{b.attempt} [{b.created_at}, {b_end})"
                    )
    return found


def verify(stack: Stack, job_ids: list[int], *, runs: Path | None = None) -> Verdict:
    """The invariants every fault test ends with."""
    lost, duplicated = [], []
    reruns: dict[int, list[tuple[int, str, float, str]]] = {}
    pending = 0
    every = {j["id"]: j for j in list_jobs(stack)}
    wanted = set(job_ids)
    if len(job_ids) != len(wanted):
        duplicated.append(f"the API returned one job id twice: {sorted(job_ids)}")
    markers = _marker_runs(runs)
    for job_id in sorted(wanted):
        job = every.get(job_id)
        if job is None:
            lost.append(f"{job_id}: missing")
            continue
        if job["status"] == "PENDING" and job.get("pending_reason"):
            pending += 1
        elif job["status"] != "SUCCEEDED":
            lost.append(f"{job_id}: {job['status']} (attempt {job['attempt']})")
        events = stack.events(job_id)
        problems = _attempt_overlaps(events)
        runs_of = markers.get(job_id, [])
        starts = [(a, n) for a, kind, _, n in runs_of if kind == "s"]
        if len(starts) != len(set(starts)) or len({a for a, _ in starts}) != len(starts):
            problems.append(f"an attempt started twice: {starts}")
        ends = [r for r in runs_of if r[1] == "e"]
        if len(ends) > 1:
            reruns[job_id] = ends
        if problems:
            history = ", ".join(
                f"{e['attempt']}:{e['to_status']} at {e['at']} by {e['actor']} ({e['reason']})"
                for e in events
            )
            duplicated.append(f"{job_id}: {'; '.join(problems)}; history: {history}")
    return Verdict(
        submitted=len(wanted),
        lost=lost,
        duplicated=duplicated,
        gpu_overlaps=gpu_overlaps(stack.database_url),
        pending=pending,
        reruns=reruns,
    )


def redis_restart(stack: Stack) -> int:
    """Start the stack's valkey again on the port it had (after `redis_server.stop()`)."""
    server = stack.redis_server
    port = int(stack.redis_url.rsplit(":", 1)[1].split("/")[0])
    server._desired_port = port
    server.start()
    assert server.port == port
    return port
