"""A fleet at scale, live: one process plays N node agents against the real stack.

    .venv/bin/python bench/fleet.py [--nodes 1000] [--gpus 8] [--jobs 10000]
                                    [--duration 60] [--interval 5] [--scale 0.1]
                                    [--reports-processes 1]

Starts a private Redis, PostgreSQL (the test run's embedded one), the API and the
scheduler (a cycle and a reports worker, as `gpusched up`, or `--reports-processes` of
them, as replicas would run) with no agent processes
(tests/support/stack.py), queues `--jobs` jobs (job arrays, 1-GPU `sleep N`, N from 5 to
60 s), then starts the fleet in a process of its own: `--nodes` simulated agents of
`--gpus` GPUs each, which speak the real wire through the real broker:

- each registers, then sends a heartbeat with its GPUs' telemetry every `--interval`
  seconds (staggered), built and sealed by the agent's own code (`registration`,
  `build_heartbeat` in workers/agent/service.py, `SealedReporter`);
- it consumes its own queue `node.<name>` and checks every order with the agent's
  `OrderGate` (signed with its key, addressed to it, recent, new);
- a job "runs" without a process: `sleep N` lasts N x `--scale` seconds on simulated GPUs
  (their telemetry shows it), then is reported finished (started first unless it ended
  at once, as the agent folds them); a stop order ends it as the agent would.

During `--duration` seconds it also submits one probe job a second (priority 1000,
`sleep 1`): submit -> start is measured on those, through a full queue. Reported:

- heartbeats stored/s, and their lag: a heartbeat's taken_at to the time the reports
  worker stored it with (its clock as it handles it, just before its commit; the fleet
  writes each heartbeat's sequence number into GPU 0's power reading, so that each
  stored sample is matched to the heartbeat it came from);
- the scheduling cycle's time, median and p99 (from the scheduler's own histogram of
  cycle durations, interpolated within its buckets; its mean is exact);
- submit -> start of the probes, p50 and p99 (a start is recorded when its started
  report is handled, so a backlog of reports delays it); drain rate (jobs finished per
  second in the window); the depth of the `reports` and `heartbeats` queues in Redis;
  heartbeats superseded (a newer one of the same node came in the same batch, so it was
  never stored) and the time of a transaction of heartbeats; CPU per process;
- the memory of each process: RSS of the API, scheduler, reports worker, Redis and the
  fleet, and PSS summed over PostgreSQL's processes (its shared buffers counted once).

Prints a table; writes bench/results/fleet-<nodes>-<db>.json. Traffic only to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import itertools
import json
import logging
import os
import queue
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.wire import (
    AttemptRef,
    Finished,
    JobResult,
    Leaving,
    OrderGate,
    Refused,
    RegisterAgain,
    Report,
    RunJob,
    SetTimeLimit,
    StopJob,
    celery_app,
    node_queue,
    note_refused,
)
from workers.agent.runner import stop_result
from workers.agent.service import build_heartbeat, registration
from workers.agent.sim_backend import SimulatedGpus
from workers.agent.worker import SealedReporter
from workers.heartbeats import task_kwargs

log = logging.getLogger("gpusched.fleet")
RECENT_S = 120.0  # as the agent: a finished attempt is repeated in heartbeats this long
ORDERS_PER_POP = 100  # orders taken from one node's queue at a time
ORDERS_IDLE_POLL_S = 0.05  # how soon the node queues are looked at again when all were empty
REPORTS_PER_BATCH = 500  # reports sent in one publish batch
_SLEEP = re.compile(r"^\s*sleep\s+(\d+(?:\.\d+)?)\s*$")


def requested_seconds(command: tuple[str, ...] | str) -> float:
    """How long a job "runs" before scaling: N for `sleep N`, else 0 (ends at once)."""
    text = command if isinstance(command, str) else shlex.join(command)
    match = _SLEEP.match(text)
    return float(match.group(1)) if match else 0.0


@dataclass
class _Run:
    order: RunJob
    started: float  # monotonic
    ends: float  # monotonic
    result: JobResult = "SUCCEEDED"


@dataclass
class SimNode:
    """One simulated agent: its GPUs, its key's gate and reporter, its attempts."""

    name: str
    reporter: SealedReporter
    gate: OrderGate
    gpus: SimulatedGpus
    started_at: float = field(default_factory=time.time)
    running: dict[tuple[int, int], _Run] = field(default_factory=dict)
    seen: set[tuple[int, int]] = field(default_factory=set)
    stopped_early: dict[tuple[int, int], JobResult] = field(default_factory=dict)
    recent: dict[tuple[int, int], tuple[float, Finished]] = field(default_factory=dict)
    heartbeats: list[float] = field(default_factory=list)  # taken_at of heartbeat #i


@dataclass
class FleetStats:
    orders: dict[str, int] = field(default_factory=dict)
    refused: int = 0
    expired: int = 0
    reports: dict[str, int] = field(default_factory=dict)
    send_failures: int = 0
    # How late the fleet's own timer fired (heartbeats and job ends), seconds: above ~0
    # the fleet itself cannot keep up and its numbers say less about the stack.
    late_s: list[float] = field(default_factory=list)


class Fleet:
    """N simulated agents in one process: one thread consumes every node's queue, one
    fires timed events (heartbeats, job ends), one sends the reports."""

    def __init__(
        self,
        *,
        redis_url: str,
        keys: Mapping[str, bytes],
        gpus: int = 8,
        model: str = "H100-80GB",
        interval_s: float = 5.0,
        time_scale: float = 0.1,
        grace_s: float = 30.0,
    ) -> None:
        self.interval_s = interval_s
        self.time_scale = time_scale
        self.grace_s = grace_s
        self.celery = celery_app(redis_url, name="fleet")
        self.nodes = {
            name: SimNode(
                name=name,
                reporter=SealedReporter(self.celery, key=key),
                gate=OrderGate(node=name, key=key),
                gpus=SimulatedGpus(gpus, model, hostname=name, seed=i),
            )
            for i, (name, key) in enumerate(keys.items())
        }
        self.stats = FleetStats()
        self._lock = threading.Lock()  # guards every node's state and the timer heap
        self._timer: list[tuple[float, int, str, str, tuple[int, int] | None]] = []
        self._seq = itertools.count()
        self._wake = threading.Condition(self._lock)
        self._outbox: queue.SimpleQueue[tuple[SimNode, Report] | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> Fleet:
        self._threads = [
            threading.Thread(target=self._send_loop, name="fleet-send", daemon=True),
            threading.Thread(target=self._consume_loop, name="fleet-orders", daemon=True),
            threading.Thread(target=self._timer_loop, name="fleet-timer", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        now = time.monotonic()
        for i, node in enumerate(self.nodes.values()):
            node.started_at = time.time()
            self._register(node)
            # Staggered over one interval, as agents started at different times are.
            first = now + self.interval_s * i / max(1, len(self.nodes))
            with self._lock:
                self._at(first, "heartbeat", node.name, None)
        return self

    def stop(self) -> None:
        """Every node leaves (as an agent stopped on purpose), then the threads end."""
        with self._lock:
            leaving = [
                (node, Leaving(node=node.name, recent=self._recent(node), taken_at=time.time()))
                for node in self.nodes.values()
            ]
        for node, message in leaving:
            self._send(node, message)
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        self._outbox.put(None)
        for thread in self._threads:
            thread.join(timeout=30)

    # -- orders ------------------------------------------------------------------

    def _consume_loop(self) -> None:
        """Every node's queue popped in one pipelined round trip (up to ORDERS_PER_POP each),
        as N agents would each pop their own; a kombu consumer of 1,000 queues takes one
        message per BRPOP of all of them, and left orders to expire in their queues."""
        import redis

        client = redis.Redis.from_url(self.celery.conf.broker_url)
        names = [node_queue(name) for name in self.nodes]
        while not self._stop.is_set():
            pipe = client.pipeline(transaction=False)
            for name in names:
                pipe.rpop(name, ORDERS_PER_POP)  # kombu pushes left: the oldest first
            popped = [raw for raws in pipe.execute() for raw in raws or ()]
            for raw in popped:
                self._on_order(raw)
            if not popped:
                self._stop.wait(ORDERS_IDLE_POLL_S)

    def _on_order(self, raw: bytes) -> None:
        """A Celery task message as kombu keeps it in Redis (protocol 2), for a node."""
        headers = json.loads(raw).get("headers", {})
        expires = headers.get("expires")
        if expires and _iso_ts(expires) < time.time():
            self._count("expired")  # as a Celery worker, an expired run_job is dropped
            return
        self._obey(task_kwargs(raw) or {})

    def _register(self, node: SimNode, *, again: bool = False) -> None:
        info = node.gpus.node_info()
        self._send(
            node,
            registration(
                node=node.name,
                info=info,
                isolation="subreaper only",
                jobs_run_as="root",
                grace_s=self.grace_s,
                again=again,
            ),
        )

    def _obey(self, fields: Mapping[str, Any]) -> None:
        name = _header_node(fields)
        node = self.nodes.get(name or "")
        if node is None:
            return
        try:
            sealed = node.gate.open(fields)
        except Refused as refused:
            note_refused(refused, receiver=f"fleet node {node.name}")
            with self._lock:
                self.stats.refused += 1
            return
        order = sealed.message
        self._count(order.KIND)
        if isinstance(order, RunJob):
            self._run(node, order, sent_at=sealed.header.sent_at)
        elif isinstance(order, StopJob):
            self._stop_attempt(node, order)
        elif isinstance(order, RegisterAgain):
            self._register(node, again=True)
        else:
            assert isinstance(order, SetTimeLimit)
            self._set_limit(node, order)

    def _run(self, node: SimNode, order: RunJob, *, sent_at: float) -> None:
        key = (order.job_id, order.attempt)
        if sent_at < node.started_at:
            return  # as the agent: meant for the agent this one replaced
        now = time.monotonic()
        with self._lock:
            if key in node.seen:
                return
            node.seen.add(key)
            early = node.stopped_early.pop(key, None)
            if early is None:
                seconds = requested_seconds(order.command) * self.time_scale
                result: JobResult = "SUCCEEDED"
                if order.max_runtime_s is not None:
                    limit = order.max_runtime_s * self.time_scale
                    if limit < seconds:
                        seconds, result = limit, "TIMED_OUT"
                run = _Run(order=order, started=now, ends=now + seconds, result=result)
                node.running[key] = run
                node.gpus.attach_job(_pid_key(key), order.gpu_indices, share=order.share)
                self._at(run.ends, "end", node.name, key)
        if early is not None:
            self._finish(node, key, early, f"stopped before it started ({early})", early=True)
        elif seconds >= 0.01:  # a job that ends at once is reported by its end alone
            self._send(
                node,
                _started(node.name, key, pid=SimulatedGpus.pid_for(_pid_key(key))),
            )

    def _stop_attempt(self, node: SimNode, order: StopJob) -> None:
        key = (order.job_id, order.attempt)
        result = stop_result(order.reason) or "CANCELLED"
        with self._lock:
            if key not in node.running:
                if key not in node.recent:
                    node.stopped_early[key] = result
                return
        self._finish(node, key, result, f"stopped ({order.reason})")

    def _set_limit(self, node: SimNode, order: SetTimeLimit) -> None:
        key = (order.job_id, order.attempt)
        with self._lock:
            run = node.running.get(key)
            if run is None or order.max_runtime_s is None:
                return
            ends = run.started + order.max_runtime_s * self.time_scale
            if ends < run.ends:
                run.ends, run.result = ends, "TIMED_OUT"
                self._at(ends, "end", node.name, key)

    # -- timed events -------------------------------------------------------------

    def _at(self, when: float, kind: str, node: str, key: tuple[int, int] | None) -> None:
        """Caller holds the lock."""
        heapq.heappush(self._timer, (when, next(self._seq), kind, node, key))
        self._wake.notify()

    def _timer_loop(self) -> None:
        while not self._stop.is_set():
            with self._wake:
                while not self._stop.is_set():
                    wait = self._timer[0][0] - time.monotonic() if self._timer else 1.0
                    if wait <= 0:
                        break
                    self._wake.wait(min(wait, 1.0))
                if self._stop.is_set():
                    return
                when, _, kind, name, key = heapq.heappop(self._timer)
                self.stats.late_s.append(time.monotonic() - when)
            node = self.nodes[name]
            if kind == "heartbeat":
                self._heartbeat(node)
                with self._lock:
                    self._at(when + self.interval_s, "heartbeat", name, None)
            else:
                assert key is not None
                with self._lock:
                    run = node.running.get(key)
                    due = run is not None and run.ends <= time.monotonic() + 0.001
                if due and run is not None:
                    self._finish(node, key, run.result, f"simulated run ({run.result})")

    def _heartbeat(self, node: SimNode) -> None:
        sample = node.gpus.sample()
        with self._lock:
            taken_at = time.time()
            running = tuple(AttemptRef(job_id=k[0], attempt=k[1]) for k in node.running)
            ours = {SimulatedGpus.pid_for(_pid_key(k)): k for k in node.running}
            recent = self._recent(node)
            seq = len(node.heartbeats)
            node.heartbeats.append(taken_at)
        message = build_heartbeat(
            node=node.name,
            interval_s=self.interval_s,
            sample=_tagged(sample, seq),
            ours=ours,
            running=running,
            recent=recent,
            taken_at=taken_at,
        )
        self._send(node, message)

    def _recent(self, node: SimNode) -> tuple[Finished, ...]:
        """Caller holds the lock."""
        horizon = time.monotonic() - RECENT_S
        for key in [k for k, (at, _) in node.recent.items() if at < horizon]:
            del node.recent[key]
        return tuple(report for _, report in node.recent.values())

    def _finish(
        self,
        node: SimNode,
        key: tuple[int, int],
        result: JobResult,
        why: str,
        *,
        early: bool = False,
    ) -> None:
        """Report an attempt's end; `early`: it never ran (a stop came before its order)."""
        report = Finished(
            node=node.name,
            job_id=key[0],
            attempt=key[1],
            result=result,
            exit_code=0 if result == "SUCCEEDED" else None,
            message=why,
            pid=SimulatedGpus.pid_for(_pid_key(key)),
        )
        with self._lock:
            if node.running.pop(key, None) is None and not early:
                return  # ended already (a stop and its end crossed): reported once
            node.gpus.detach_job(_pid_key(key))
            node.recent[key] = (time.monotonic(), report)
        self._send(node, report)

    # -- sending -------------------------------------------------------------------

    def _send(self, node: SimNode, message: Report) -> None:
        self._outbox.put((node, message))

    def _send_loop(self) -> None:
        """What is waiting in the outbox, sent in one publish batch: one Redis round trip,
        as N agents would each send theirs at once."""
        while True:
            waiting = [self._outbox.get()]
            while len(waiting) < REPORTS_PER_BATCH and not self._outbox.empty():
                waiting.append(self._outbox.get())
            batch = [item for item in waiting if item is not None]
            try:
                with self.celery.producer_or_acquire() as producer, producer.batch():
                    sent = [(m, node.reporter.report(m, producer=producer)) for node, m in batch]
            except Exception as exc:  # the batch's outcome is unknown: counted as failed
                log.warning("could not send %d reports: %s", len(batch), exc)
                sent = [(message, False) for _, message in batch]
            with self._lock:
                for message, ok in sent:
                    kind = message.KIND
                    self.stats.reports[kind] = self.stats.reports.get(kind, 0) + 1
                    self.stats.send_failures += 0 if ok else 1
            if len(batch) < len(waiting):
                return

    def _count(self, what: str) -> None:
        with self._lock:
            if what == "expired":
                self.stats.expired += 1
            else:
                self.stats.orders[what] = self.stats.orders.get(what, 0) + 1

    def summary(self) -> dict[str, Any]:
        with self._lock:
            late = sorted(self.stats.late_s)
            return {
                "nodes": len(self.nodes),
                "orders": dict(self.stats.orders),
                "orders_refused": self.stats.refused,
                "orders_expired": self.stats.expired,
                "reports": dict(self.stats.reports),
                "send_failures": self.stats.send_failures,
                "timer_late_p50_s": late[len(late) // 2] if late else 0.0,
                "timer_late_max_s": late[-1] if late else 0.0,
                "running": sum(len(n.running) for n in self.nodes.values()),
                "heartbeats": {n.name: n.heartbeats for n in self.nodes.values()},
            }


def _pid_key(key: tuple[int, int]) -> str:
    return f"job-{key[0]}-{key[1]}"


def _started(node: str, key: tuple[int, int], *, pid: int) -> Report:
    from app.wire import Started

    return Started(node=node, job_id=key[0], attempt=key[1], pid=pid)


def _tagged(sample: Any, seq: int) -> Any:
    """The sample with GPU 0's power reading set to the heartbeat's sequence number."""
    from dataclasses import replace

    if not sample.gpus:
        return sample
    first = replace(sample.gpus[0], power_w=float(seq))
    return replace(sample, gpus=(first, *sample.gpus[1:]))


def _header_node(fields: Mapping[str, Any]) -> str | None:
    """The node an order's header names (the gate checks it against the signature)."""
    try:
        header = json.loads(fields.get("header", ""))
        return str(header["node"])
    except (ValueError, TypeError, KeyError):
        return None


def _iso_ts(value: Any) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except ValueError:
        return float("inf")


# -- the fleet as a process of its own ----------------------------------------------


def serve(config_path: Path, stats_path: Path) -> int:
    """Run a fleet from a JSON config until SIGTERM (or stdin closes), then write its
    summary to `stats_path`."""
    from app.nodes.keys import node_key

    config = json.loads(config_path.read_text())
    secret = bytes.fromhex(config.pop("secret_hex"))
    names = config.pop("names")
    fleet = Fleet(keys={n: node_key(secret, n) for n in names}, **config)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())

    def on_eof() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=on_eof, daemon=True).start()
    fleet.start()
    print("fleet started", flush=True)
    done.wait()
    fleet.stop()
    stats_path.write_text(json.dumps(fleet.summary()))
    return 0


# -- the benchmark ---------------------------------------------------------------------


def rss_kb(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def tree_rss_kb(pid: int) -> int:
    """RSS of a process and its children (the scheduler's embedded beat)."""
    total = rss_kb(pid)
    with contextlib.suppress(OSError):
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            total += tree_rss_kb(int(child))
    return total


def postgres_pss_kb(port: int) -> int:
    """PSS over every process of the PostgreSQL server on `port` (postmaster + backends)."""
    total = 0
    main = None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "postgres" in cmd and f"-p {port}" in cmd:
                main = int(entry.name)
    if main is None:
        return 0
    pids = [main]
    with contextlib.suppress(OSError):
        pids += [int(c) for c in Path(f"/proc/{main}/task/{main}/children").read_text().split()]
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
    return total


def redis_pid(port: int) -> int | None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if ("valkey" in cmd or "redis" in cmd) and (
                f":{port}" in cmd or f"--port {port}" in cmd
            ):
                return int(entry.name)
    return None


def scrape(urls: Sequence[str]) -> list[str]:
    """The lines of every process's metrics (a reports process per replica)."""
    import httpx

    return [line for url in urls for line in httpx.get(url, timeout=10).text.splitlines()]


def histogram(urls: Sequence[str], name: str, label: str = "") -> dict[str, float]:
    """A Prometheus histogram's cumulative buckets (le -> count), summed over the series
    whose labels hold `label` (e.g. 'kind="heartbeat"') in every process, and its _sum
    and _count."""
    out: dict[str, float] = {}
    for line in scrape(urls):
        if not line.startswith(name) or label not in line:
            continue
        metric, _, value = line.rpartition(" ")
        if metric.startswith(f"{name}_bucket"):
            le = re.search(r'le="([^"]+)"', metric)
            if le:
                out[le.group(1)] = out.get(le.group(1), 0.0) + float(value)
        elif metric.startswith(f"{name}_sum"):
            out["sum"] = out.get("sum", 0.0) + float(value)
        elif metric.startswith(f"{name}_count"):
            out["count"] = out.get("count", 0.0) + float(value)
    return out


def counter(urls: Sequence[str], name: str, label: str = "") -> float:
    """A Prometheus counter's value, summed over the series whose labels hold `label` in
    every process."""
    return sum(
        float(line.rpartition(" ")[2])
        for line in scrape(urls)
        if line.startswith(f"{name}_total") and label in line
    )


def histogram_quantile(before: dict[str, float], after: dict[str, float], q: float) -> float:
    """Quantile q of the observations between two scrapes, linear within its bucket."""
    bounds = sorted((float(k), k) for k in after if k not in ("sum", "count"))
    counts = [(b, after[k] - before.get(k, 0.0)) for b, k in bounds]
    total = counts[-1][1] if counts else 0.0
    if total <= 0:
        return float("nan")
    target = q * total
    lower, below = 0.0, 0.0
    for bound, cumulative in counts:
        if cumulative >= target:
            if bound == float("inf"):
                return float("inf")  # past the last bucket: more than `lower`
            share = (target - below) / max(cumulative - below, 1e-9)
            return lower + (bound - lower) * share
        lower, below = bound, cumulative
    return lower


def between(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Count, mean and interpolated p50/p99 of the observations between two scrapes."""
    count = after.get("count", 0.0) - before.get("count", 0.0)
    return {
        "count": count,
        "mean_s": (after.get("sum", 0.0) - before.get("sum", 0.0)) / max(1.0, count),
        "p50_s": histogram_quantile(before, after, 0.5),
        "p99_s": histogram_quantile(before, after, 0.99),
    }


def ms(seconds: float) -> str:
    return "> 5000 ms" if seconds == float("inf") else f"{1000 * seconds:.0f} ms"


def proc_cpu_s(pid: int) -> float:
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rfind(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=5.0, help="heartbeat interval, s")
    parser.add_argument("--scale", type=float, default=0.1, help="a job's time x this")
    parser.add_argument("--db", choices=("postgresql", "sqlite"), default="postgresql")
    parser.add_argument(
        "--reports-processes",
        type=int,
        default=1,
        help="reports processes (replicas of `gpusched scheduler --only reports`)",
    )
    parser.add_argument(
        "--warmup-max", type=float, default=300.0, help="wait at most this for nodes READY"
    )
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--serve", nargs=2, metavar=("CONFIG", "STATS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        logging.basicConfig(level=logging.WARNING)
        return serve(Path(args.serve[0]), Path(args.serve[1]))
    return run_bench(args)


def submit_backlog(stack: Any, jobs: int) -> float:
    """`jobs` 1-GPU jobs as arrays of at most 1,000 tasks; returns the seconds it took."""
    started = time.monotonic()
    rng = random.Random(7)
    left = jobs
    while left > 0:
        size = min(1000, left)
        seconds = rng.choice((5, 10, 20, 30, 60))
        stack.submit(
            {
                "name": f"fleet-backlog-{left}",
                "command": f"sleep {seconds}",
                "gpus": 1,
                "max_runtime_s": 600,
                "array": {"indices": f"0-{size - 1}"},
            }
        )
        left -= size
    return time.monotonic() - started


def run_bench(args: argparse.Namespace) -> int:
    from sqlalchemy import func, select

    from app.db import make_engine
    from app.jobs.models import Job
    from app.nodes.models import Gpu, GpuSample, Node
    from bench.common import durable_postgres, machine_info, percentile, print_table, write_results
    from tests.support.servers import free_port
    from tests.support.stack import Stack

    durable_postgres()

    root = Path(tempfile.mkdtemp(prefix="gpusched-fleet-"))
    metrics_port = free_port()
    reports_ports = [free_port() for _ in range(args.reports_processes)]
    stack = Stack(
        root,
        db=args.db,
        agents={},
        env={
            "GPUSCHED_SCHEDULER_INTERVAL_S": "2",
            "GPUSCHED_SCHEDULER_STABILITY_WINDOW_S": "5",
            "GPUSCHED_SCHEDULER_RECONCILE_INTERVAL_S": "5",
            # Three intervals, as a production setting would be; lag past it shows as
            # nodes lost, which the table reports.
            "GPUSCHED_SCHEDULER_HEARTBEAT_TIMEOUT_S": str(max(30.0, 3 * args.interval)),
            "GPUSCHED_SCHEDULER_TELEMETRY_MAX_AGE_S": str(max(30.0, 3 * args.interval)),
            "GPUSCHED_SCHEDULER_METRICS_PORT": str(metrics_port),
            "GPUSCHED_LOG_LEVEL": "warning",
            # The backlog and the probes come from one user (the default cap is 10,000).
            "GPUSCHED_MAX_PENDING_JOBS_PER_USER": str(args.jobs + 10_000),
        },
        reports_worker=True,
        reports_env=[
            {"GPUSCHED_SCHEDULER_REPORTS_METRICS_PORT": str(port)} for port in reports_ports
        ],
    )
    print(f"starting the stack ({args.db}) in {root} ...", flush=True)
    stack.start(timeout=180)
    engine = make_engine(stack.database_url)
    fleet_proc: subprocess.Popen[bytes] | None = None
    stats_path = root / "fleet-stats.json"
    names = [f"{stack.prefix}f{i:04d}" for i in range(args.nodes)]
    try:
        submit_s = submit_backlog(stack, args.jobs)
        print(
            f"{args.jobs} jobs queued in {submit_s:.1f}s; starting {args.nodes} agents", flush=True
        )
        config = root / "fleet.json"
        config.write_text(
            json.dumps(
                {
                    "redis_url": stack.redis_url,
                    "secret_hex": stack.node_secret.hex(),
                    "names": names,
                    "gpus": args.gpus,
                    "interval_s": args.interval,
                    "time_scale": args.scale,
                }
            )
        )
        os.chmod(config, 0o600)
        fleet_log = (root / "proc-logs" / "fleet.log").open("ab")
        fleet_proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(config), str(stats_path)],
            stdin=subprocess.PIPE,
            stdout=fleet_log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        )
        # Warm-up: every node registered and heartbeating.
        registered_by = time.monotonic() + args.warmup_max
        ready = 0
        while time.monotonic() < registered_by:
            with engine.connect() as conn:
                ready = (
                    conn.scalar(select(func.count()).select_from(Node).where(Node.state == "READY"))
                    or 0
                )
            if ready >= args.nodes:
                break
            time.sleep(1)
        warmup_s = args.warmup_max - (registered_by - time.monotonic())
        print(
            f"{ready} nodes READY after {warmup_s:.0f}s; measuring {args.duration:.0f}s", flush=True
        )
        cycle_url = [f"http://127.0.0.1:{metrics_port}/metrics"]
        reports_url = [f"http://127.0.0.1:{port}/metrics" for port in reports_ports]
        import redis

        from bench.drain import cpu_seconds

        broker = redis.Redis.from_url(stack.redis_url, socket_timeout=10)
        scrapes = {
            "cycle": (cycle_url, "gpusched_scheduling_cycle_seconds", ""),
            "plan": (cycle_url, "gpusched_scheduling_plan_seconds", ""),
            "heartbeat": (reports_url, "gpusched_agent_report_seconds", 'kind="heartbeat"'),
            "reports": (reports_url, "gpusched_agent_report_seconds", ""),
            "heartbeat batch": (reports_url, "gpusched_heartbeat_batch_seconds", ""),
        }
        counters = {
            outcome: (reports_url, "gpusched_heartbeats_drained", f'outcome="{outcome}"')
            for outcome in ("stored", "superseded")
        }
        before = {k: histogram(*v) for k, v in scrapes.items()}
        counted_before = {k: counter(*v) for k, v in counters.items()}
        cpu_before = cpu_seconds()
        fleet_cpu_before = proc_cpu_s(fleet_proc.pid)
        depths: dict[str, list[int]] = {"reports": [], "heartbeats": [], "scheduler": []}
        window_start = time.time()
        probes: list[int] = []
        memory: dict[str, list[int]] = {}
        pg_port = int(re.search(r":(\d+)/", stack.database_url).group(1))  # type: ignore[union-attr]
        redis_port = int(stack.redis_url.rsplit(":", 1)[1].split("/")[0])
        rpid = redis_pid(redis_port)
        next_probe = time.monotonic()
        end = time.monotonic() + args.duration
        while time.monotonic() < end:
            if time.monotonic() >= next_probe:
                job = stack.submit(
                    {"name": "probe", "command": "sleep 1", "gpus": 1, "priority": 1000}
                )
                probes.append(job["id"])
                next_probe += 1.0
                sample = {
                    "api": tree_rss_kb(stack.procs["api"].pid),
                    "scheduler (cycle)": tree_rss_kb(stack.procs["scheduler"].pid),
                    "reports worker": sum(
                        tree_rss_kb(proc.pid)
                        for label, proc in stack.procs.items()
                        if label.startswith("reports")
                    ),
                    "redis": rss_kb(rpid) if rpid else 0,
                    "postgresql (PSS, all)": postgres_pss_kb(pg_port),
                    "fleet": rss_kb(fleet_proc.pid),
                }
                for k, v in sample.items():
                    memory.setdefault(k, []).append(v)
                for q in depths:  # Celery's list in Redis: messages not yet taken
                    depths[q].append(int(broker.llen(q)))
            time.sleep(0.05)
        window_end = time.time()
        after = {k: histogram(*v) for k, v in scrapes.items()}
        counted = {k: counter(*v) - counted_before[k] for k, v in counters.items()}
        cpu_after = cpu_seconds()
        fleet_cpu = proc_cpu_s(fleet_proc.pid) - fleet_cpu_before
        broker.close()
        time.sleep(max(5.0, args.interval))  # probes placed near the end get to start
        with engine.connect() as conn:
            rows = conn.execute(
                select(Job.id, Job.status, Job.created_at, Job.started_at, Job.finished_at)
            ).all()
            samples = conn.execute(
                select(Node.name, GpuSample.at, GpuSample.power_w)
                .join(Gpu, Gpu.id == GpuSample.gpu_id)
                .join(Node, Node.id == Gpu.node_id)
                .where(Gpu.index == 0)
            ).all()
            states = dict(conn.execute(select(Node.state, func.count()).group_by(Node.state)).all())
        fleet_proc.stdin.close()  # type: ignore[union-attr]
        fleet_proc.wait(timeout=120)
        fleet = json.loads(stats_path.read_text())
    finally:
        if fleet_proc is not None and fleet_proc.poll() is None:
            fleet_proc.kill()
        engine.dispose()
        stack.stop()

    # Heartbeats: each stored sample matched to the heartbeat it came from.
    sent = fleet.pop("heartbeats")
    lags = []
    stored_in_window = 0
    for name, at, power in samples:
        at_s = at.timestamp()
        if window_start <= at_s <= window_end:
            stored_in_window += 1
            taken = sent.get(name, [])
            seq = int(power) if power is not None else -1
            if 0 <= seq < len(taken):
                lags.append(at_s - taken[seq])
    window = window_end - window_start
    probe_set = set(probes)
    waits = [
        (r.started_at - r.created_at).total_seconds()
        for r in rows
        if r.id in probe_set and r.started_at is not None
    ]
    finished = [
        r
        for r in rows
        if r.finished_at is not None and window_start <= r.finished_at.timestamp() <= window_end
    ]
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[str(r.status)] = statuses.get(str(r.status), 0) + 1
    stats = {k: between(before[k], after[k]) for k in scrapes}
    cycles = stats["cycle"]
    cpu = {k: cpu_after.get(k, 0.0) - cpu_before.get(k, 0.0) for k in cpu_after}
    # No agent processes here ("agents" would be another stack's on this machine).
    cpu = {k: v for k, v in cpu.items() if v > 0 and k != "agents"}
    cpu["fleet"] = fleet_cpu
    mem_mb = {k: max(v) / 1024 for k, v in memory.items()}
    load = os.getloadavg()
    rows_out = [
        (
            "cluster",
            f"{args.nodes} nodes x {args.gpus} simulated GPUs, heartbeat every {args.interval:g}s;"
            f" {args.reports_processes} reports process(es)",
        ),
        (
            "queue",
            f"{args.jobs} jobs (1 GPU, sleep 5-60 s x {args.scale:g}) queued before the fleet came",
        ),
        ("warm-up", f"{warmup_s:.0f}s until every node READY; window {window:.0f}s"),
        (
            "heartbeats stored",
            f"{stored_in_window / window:.1f}/s (sent {args.nodes / args.interval:.1f}/s)",
        ),
        (
            "heartbeat lag",
            f"p50 {percentile(lags, 50):.2f}s  p99 {percentile(lags, 99):.2f}s  "
            f"max {max(lags, default=float('nan')):.2f}s  (interval {args.interval:g}s)",
        ),
        (
            "cycle time",
            f"p50 {ms(cycles['p50_s'])}  p99 {ms(cycles['p99_s'])}  "
            f"mean {ms(cycles['mean_s'])}  ({cycles['count']:.0f} cycles; their plan: "
            f"p50 {ms(stats['plan']['p50_s'])}, mean {ms(stats['plan']['mean_s'])})",
        ),
        (
            "submit -> start",
            f"p50 {percentile(waits, 50):.2f}s  p99 {percentile(waits, 99):.2f}s  "
            f"({len(waits)} of {len(probes)} probes started, priority 1000)",
        ),
        ("drain rate", f"{len(finished) / window:.1f} jobs/s finished in the window"),
        (
            "report handling",
            f"heartbeat mean {ms(stats['heartbeat']['mean_s'])} "
            f"({stats['heartbeat']['count']:.0f}); all reports mean "
            f"{ms(stats['reports']['mean_s'])} ({stats['reports']['count']:.0f}); "
            f"a transaction of heartbeats mean {ms(stats['heartbeat batch']['mean_s'])} "
            f"({stats['heartbeat batch']['count']:.0f})",
        ),
        (
            "heartbeats drained",
            f"stored {counted['stored']:.0f}, superseded (never stored) "
            f"{counted['superseded']:.0f}",
        ),
        (
            "Redis queue depth",
            ", ".join(
                f"{q}: median {percentile([float(d) for d in v], 50):.0f} max {max(v, default=0)}"
                for q, v in depths.items()
            ),
        ),
        (
            "CPU used (s)",
            ", ".join(f"{k} {v:.0f}" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]))
            + f"  (of {window * (os.cpu_count() or 1):.0f} CPU-s in the window)",
        ),
        ("nodes at the end", ", ".join(f"{k}: {v}" for k, v in states.items())),
        (
            "fleet",
            f"orders {fleet['orders']}, refused {fleet['orders_refused']}, "
            f"timer late p50 {fleet['timer_late_p50_s']:.3f}s max {fleet['timer_late_max_s']:.2f}s",
        ),
        ("memory (max RSS)", ", ".join(f"{k} {v:.0f} MB" for k, v in mem_mb.items())),
        ("load average", " ".join(f"{x:.1f}" for x in load) + f" on {os.cpu_count()} CPUs"),
    ]
    print_table(rows_out, f"fleet: {args.nodes} agents through the real stack, {args.db}")
    result = {
        "db": args.db,
        "nodes": args.nodes,
        "gpus_per_node": args.gpus,
        "jobs": args.jobs,
        "interval_s": args.interval,
        "time_scale": args.scale,
        "reports_processes": args.reports_processes,
        "window_s": window,
        "warmup_s": warmup_s,
        "heartbeats_stored_per_s": stored_in_window / window,
        "heartbeat_lag_s": {
            "p50": percentile(lags, 50),
            "p99": percentile(lags, 99),
            "n": len(lags),
        },
        "cycle": cycles,
        "histograms": stats,
        "redis_queue_depth": depths,
        "heartbeats_drained": counted,
        "cpu_seconds": cpu,
        "probe_submit_to_start_s": {
            "p50": percentile(waits, 50),
            "p99": percentile(waits, 99),
            "started": len(waits),
            "submitted": len(probes),
        },
        "drain_jobs_per_s": len(finished) / window,
        "statuses": statuses,
        "node_states": states,
        "memory_max_mb": mem_mb,
        "fleet": fleet,
        "load_average": load,
        "machine": machine_info(),
    }
    path = write_results(f"fleet-{args.nodes}", result)
    print(f"results: {path}")
    if not args.keep:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
