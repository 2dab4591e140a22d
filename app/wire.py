"""The wire between the scheduler and its agents: every message as a frozen dataclass,
its parse and dump, how each is sealed with its node's key, and the Celery app and names
both sides use.

This is the agent's one door into `app` (with the settings and the process helpers): it
imports nothing else of ours.

Messages. Orders go to an agent's own queue (`node.<name>`): `RunJob`, `StopJob`,
`SetTimeLimit`, `RegisterAgain`. Reports go to the scheduler's `reports` queue:
`Register`, `Started`, `Finished`, `Leaving`; `Heartbeat` (GPU readings with their
processes, attempts running and lately finished) to its own `heartbeats` queue. Every
message names its node. A message is parsed from JSON in strict mode: a missing field,
a wrong type or a value out of range is refused with the field named (`Malformed`).
Unknown fields are ignored, so a newer peer may add one; a new optional field is one line
with a default.

Sealing. A message travels as three strings: a header (kind, node, send time, nonce), the
body, and an HMAC-SHA256 of both under the node's key (`seal`). The receiver believes a
message only if the node it names signed it (`unseal`): the scheduler derives every
node's key from the installation's secret; an agent holds its own. Orders are also
refused when older than ORDER_TTL_S or seen before (`OrderGate`): a job that reached
Redis can neither forge an order nor replay one. A refused message is logged, counted
(`gpusched_refused_messages_total`) and changes nothing.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from celery import Celery
from kombu.transport import redis as kombu_redis
from prometheus_client import Counter
from pydantic import Field, TypeAdapter, ValidationError

log = logging.getLogger("gpusched.wire")

# -- names ---------------------------------------------------------------------------

REPORTS_QUEUE = "reports"
# Heartbeats travel apart from the other reports: a backlog of them (snapshots, of which
# only each node's newest matters) must never delay a job's start or end. The scheduler
# drains this queue itself, in batches (workers/heartbeats.py), not through Celery's pool.
HEARTBEATS_QUEUE = "heartbeats"
AGENT_REPORT = "gpusched.agent_report"
RUN_JOB = "gpusched.run_job"
STOP_JOB = "gpusched.stop_job"
SET_TIME_LIMIT = "gpusched.set_time_limit"
REGISTER_AGAIN = "gpusched.register_again"

# An order is believed this long after it was sent (munge's credential TTL is the same);
# a clock ahead by more is refused too. Scheduler and agent clocks are assumed in sync
# (NTP), as Slurm assumes them.
ORDER_TTL_S = 300.0


def node_queue(node: str) -> str:
    return f"node.{node}"


def report_queue(kind: str) -> str:
    """The queue a report of `kind` goes to: heartbeats to their own."""
    return HEARTBEATS_QUEUE if kind == "heartbeat" else REPORTS_QUEUE


# -- messages ------------------------------------------------------------------------

NodeName = Annotated[str, Field(min_length=1, max_length=128)]
JobId = Annotated[int, Field(ge=1, le=2**63 - 1)]
Attempt = Annotated[int, Field(ge=1, le=2**31 - 1)]
Count = Annotated[int, Field(ge=0)]
Seconds = Annotated[float, Field(ge=0)]
# REFUSED: the node would not run it (its owner's account cannot be used there).
JobResult = Literal["SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "PREEMPTED", "LOST", "REFUSED"]
# How a node fences its jobs (workers/agent/fence.py).
Isolation = Literal["cgroup v2", "cgroup v1", "subreaper only"]
StopReason = Literal["cancel", "preempt", "requeue"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunJob:
    """Start one attempt of a job on `node`: its part of the gang (`node_rank`)."""

    KIND: ClassVar[str] = "run_job"
    TASK: ClassVar[str] = RUN_JOB
    node: NodeName
    job_id: JobId
    attempt: Attempt
    command: tuple[str, ...] | str
    script: str | None = None
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    gpu_indices: tuple[Count, ...] = ()
    share: Annotated[float, Field(gt=0, le=1)] = 1.0
    gpu_memory_mb: Count | None = None
    max_runtime_s: Seconds | None = None
    grace_s: Seconds | None = None
    master_addr: str = "127.0.0.1"
    master_port: Annotated[int, Field(ge=1, le=65535)]
    world_size: Annotated[int, Field(ge=1)] = 1
    node_rank: Count = 0
    nproc_per_node: Annotated[int, Field(ge=1)] = 1
    # The owner's Unix account (as the user is mapped now), which a root agent runs the
    # job as (docs/isolation.md).
    unix_user: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StopJob:
    """Stop an attempt (SIGTERM, its grace period, SIGKILL); `grace_s` shortens it."""

    KIND: ClassVar[str] = "stop_job"
    TASK: ClassVar[str] = STOP_JOB
    node: NodeName
    job_id: JobId
    attempt: Attempt
    reason: StopReason
    grace_s: Seconds | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SetTimeLimit:
    """Move a placed attempt's time limit (seconds from its start; None: none)."""

    KIND: ClassVar[str] = "set_time_limit"
    TASK: ClassVar[str] = SET_TIME_LIMIT
    node: NodeName
    job_id: JobId
    attempt: Attempt
    max_runtime_s: Seconds | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterAgain:
    """Send `Register` again: a heartbeat came from a node the scheduler does not know
    (its registration was lost with Redis), as slurmctld asks an unknown slurmd."""

    KIND: ClassVar[str] = "register_again"
    TASK: ClassVar[str] = REGISTER_AGAIN
    node: NodeName


Order = RunJob | StopJob | SetTimeLimit | RegisterAgain


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuInfo:
    """One GPU as the agent found it at its start."""

    index: Count
    uuid: str
    model: str
    memory_total_mb: Count
    nvlink_peers: tuple[Count, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Register:
    """An agent starts: its node, how it is reached, and its GPUs."""

    KIND: ClassVar[str] = "register"
    node: NodeName
    hostname: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    agent_version: str = ""
    backend: str = ""
    message: str = ""
    gpus: tuple[GpuInfo, ...] = ()
    isolation: Isolation | None = None
    # The one account every job runs as (a single-user node), or None: each its owner's.
    jobs_run_as: str | None = None
    # The agent's default grace period (a job that asks for none gets it).
    grace_s: Seconds | None = None
    # Sent on the scheduler's request (RegisterAgain), not at the agent's start: its
    # attempts still run, so none of the node's LOST jobs may be requeued for it.
    again: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuProcessReading:
    """A process using a GPU; `job_id` when it is one of the agent's jobs, else foreign."""

    pid: Count  # as the driver gives it: one odd reading must not cost the whole heartbeat
    used_memory_mb: Count | None = None
    job_id: JobId | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuReading:
    """One GPU's readings; any number is None when the GPU cannot tell."""

    index: Count
    uuid: str = ""
    healthy: bool = True
    health_message: str | None = None
    util_pct: float | None = None
    memory_util_pct: float | None = None
    memory_used_mb: Count | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    processes: tuple[GpuProcessReading, ...] = ()
    foreign_util_pct: float = 0.0
    foreign_memory_mb: Count = 0
    # Readings it could not give that the scheduler decides with ("processes: why"): an
    # unknown GPU is not schedulable (it is not free either).
    unknown: tuple[str, ...] = ()
    # MIG mode is on: sliced, so it is not handed out as a whole GPU.
    mig_enabled: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptRef:
    job_id: JobId
    attempt: Attempt


@dataclass(frozen=True, slots=True, kw_only=True)
class Started:
    """An attempt's process started (as `pid`)."""

    KIND: ClassVar[str] = "started"
    node: NodeName
    job_id: JobId
    attempt: Attempt
    pid: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Finished:
    """How an attempt ended on `node`."""

    KIND: ClassVar[str] = "finished"
    node: NodeName
    job_id: JobId
    attempt: Attempt
    result: JobResult
    exit_code: int | None = None
    message: str = ""
    pid: int | None = None
    # The attempt's usage, as its node's fence measured it (None where it cannot).
    cpu_s: Seconds | None = None
    memory_peak_mb: Count | None = None
    # REFUSED: the owner's account that cannot be used on the node, and why.
    account: str | None = None
    account_reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """Readings of the node's GPUs, and the attempts it runs and lately finished, as they
    were at `taken_at` (unix seconds)."""

    KIND: ClassVar[str] = "heartbeat"
    node: NodeName
    interval_s: Annotated[float, Field(gt=0)] = 5.0
    gpus: tuple[GpuReading, ...] = ()
    running: tuple[AttemptRef, ...] = ()
    recent: tuple[Finished, ...] = ()
    taken_at: float | None = None
    # Accounts jobs cannot run as on this node now, and why (docs/isolation.md).
    unusable_accounts: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Leaving:
    """The agent stops on purpose: the node takes no more jobs, and how its last attempts
    ended."""

    KIND: ClassVar[str] = "leaving"
    node: NodeName
    recent: tuple[Finished, ...] = ()
    taken_at: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Header:
    """Who a message is for or from, and when it was sent; signed with the body."""

    kind: str
    node: NodeName
    sent_at: float
    nonce: Annotated[str, Field(min_length=16, max_length=64)]


Report = Register | Heartbeat | Started | Finished | Leaving
Message = Order | Report
M = TypeVar("M", bound=Message | Header)

ORDER_TYPES: dict[str, type[Order]] = {
    t.KIND: t for t in (RunJob, StopJob, SetTimeLimit, RegisterAgain)
}
REPORT_TYPES: dict[str, type[Report]] = {
    t.KIND: t for t in (Register, Heartbeat, Started, Finished, Leaving)
}


class Malformed(ValueError):
    """A message that does not parse: `field` names where (e.g. "gpus[0].index")."""

    def __init__(self, field_name: str, reason: str) -> None:
        super().__init__(f"{field_name}: {reason}")
        self.field = field_name
        self.reason = reason


_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def _adapter(cls: type[Any]) -> TypeAdapter[Any]:
    adapter = _ADAPTERS.get(cls)
    if adapter is None:  # built once per type (a race builds it twice, harmlessly)
        adapter = _ADAPTERS[cls] = TypeAdapter(cls)
    return adapter


def parse(cls: type[M], text: str | bytes) -> M:
    """The message of type `cls` in a JSON text; Malformed names the first bad field."""
    try:
        message: M = _adapter(cls).validate_json(text, strict=True)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        raise Malformed(_field_path(error["loc"]), error["msg"]) from None
    return message


def _field_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path or "(message)"


def dump(message: Message | Header) -> str:
    """The message as compact JSON text (what `parse` reads back)."""
    return _adapter(type(message)).dump_json(message).decode()


def as_dict(message: Any) -> dict[str, Any]:
    """A message (or a part of one) as plain JSON values, e.g. for a JSON column."""
    data: dict[str, Any] = _adapter(type(message)).dump_python(message, mode="json")
    return data


# -- sealing -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sealed:
    """A message whose signature was checked."""

    header: Header
    message: Message


RefusalReason = Literal[
    "unsigned",  # not a sealed message at all (what a forger without a key sends)
    "malformed",  # a header or body that does not parse
    "wrong_kind",  # a kind this receiver does not take (an order sent as a report)
    "bad_signature",  # not signed with the key of the node it names
    "wrong_node",  # a body naming another node than the header, or not for this agent
    "expired",  # an order sent more than ORDER_TTL_S ago (or ahead)
    "replayed",  # an order already received
    "not_placed_here",  # a report about an attempt its node does not hold
]

REFUSED_MESSAGES = Counter(
    "gpusched_refused_messages",
    "Messages between scheduler and agents refused (not believed, nothing changed)",
    ["kind", "reason"],
)


class Refused(Exception):
    def __init__(self, reason: RefusalReason, detail: str, *, kind: str = "unknown") -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.kind = kind


def note_refused(refused: Refused, *, receiver: str) -> None:
    """Log and count a refused message (it changed nothing)."""
    REFUSED_MESSAGES.labels(refused.kind, refused.reason).inc()
    log.warning("%s refused a message (%s): %s", receiver, refused.kind, refused)


def _signature(key: bytes, header: str, body: str) -> str:
    # A header's JSON holds no raw newline, so header + "\n" + body is unambiguous.
    return hmac.new(key, f"{header}\n{body}".encode(), hashlib.sha256).hexdigest()


def seal(message: Message, *, key: bytes, now: float | None = None) -> dict[str, str]:
    """The Celery kwargs that carry `message`, signed with the key of the node it names
    (the sender of a report, the addressee of an order)."""
    header = dump(
        Header(
            kind=message.KIND,
            node=message.node,
            sent_at=time.time() if now is None else now,
            nonce=secrets.token_hex(16),
        )
    )
    body = dump(message)
    return {"header": header, "body": body, "sig": _signature(key, header, body)}


def send_sealed(
    celery: Any,
    task: str,
    message: Message,
    *,
    key: bytes,
    queue: str,
    expires: float | None = None,
    producer: Any = None,
) -> None:
    """Send `message` sealed with `key` as Celery task `task` to `queue` (through
    `producer`, e.g. inside its publish batch). Celery would repr the sealed kwargs of every
    message for its logs: about a tenth of a send's CPU, for text nobody reads.

    Nothing is declared: a queue named by a string is published to through the anonymous
    direct exchange, the queue's name as routing key (a Redis LPUSH to that list), which
    needs no binding, and whoever consumes a queue declares it. Declaring it with each
    message (Celery's default) cost two thirds of a send's CPU: a cycle that places 600
    jobs at 1,000 nodes spent 0.33 s of its 0.4 s sending their run orders."""
    celery.send_task(
        task,
        kwargs=seal(message, key=key),
        kwargsrepr=f"<sealed {message.KIND} of {message.node}>",
        queue=queue,
        expires=expires,
        producer=producer,
        declare=[],
    )


def unseal(
    fields: Mapping[str, Any],
    *,
    types: Mapping[str, type[Message]],
    key_for: Callable[[str], bytes],
) -> Sealed:
    """The message in a task's kwargs if it is of one of `types` (by kind) and signed with
    the key of the node it names; else Refused. Only the header is read before the
    signature is checked."""
    header_text, body, sig = (fields.get(name) for name in ("header", "body", "sig"))
    if not (isinstance(header_text, str) and isinstance(body, str) and isinstance(sig, str)):
        raise Refused("unsigned", "no signed header and body (keys: header, body, sig)")
    try:
        header = parse(Header, header_text)
    except Malformed as exc:
        raise Refused("malformed", f"header.{exc}") from None
    cls = types.get(header.kind)
    if cls is None:  # the label stays "unknown": a forger must not mint metric labels
        raise Refused("wrong_kind", f"{header.kind[:40]!r} is not taken here")
    kind = cls.KIND
    expected = _signature(key_for(header.node), header_text, body)
    if not hmac.compare_digest(expected, sig):
        raise Refused("bad_signature", f"not signed with node {header.node}'s key", kind=kind)
    try:
        message = parse(cls, body)
    except Malformed as exc:
        raise Refused("malformed", str(exc), kind=kind) from None
    if message.node != header.node:
        raise Refused("wrong_node", f"node: {message.node}, signed for {header.node}", kind=kind)
    for i, inner in enumerate(getattr(message, "recent", ())):
        if inner.node != header.node:
            raise Refused(
                "wrong_node", f"recent[{i}].node: {inner.node}, not {header.node}", kind=kind
            )
    return Sealed(header=header, message=message)


class OrderGate:
    """An agent's check of the orders it receives: signed with its key, addressed to it,
    sent within ORDER_TTL_S, and never seen before. Thread-safe (Celery's thread pool)."""

    def __init__(self, *, node: str, key: bytes, ttl_s: float = ORDER_TTL_S) -> None:
        self.node = node
        self._key = key
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._seen: set[str] = set()  # nonces, until their orders expire
        self._expiry: list[tuple[float, str]] = []  # a heap of (sent_at, nonce) of _seen

    def open(self, fields: Mapping[str, Any], *, now: float | None = None) -> Sealed:
        sealed = unseal(fields, types=ORDER_TYPES, key_for=self._key_for)
        header = sealed.header
        if header.node != self.node:
            raise Refused("wrong_node", f"for node {header.node}", kind=header.kind)
        now = time.time() if now is None else now
        if not math.isfinite(header.sent_at) or abs(now - header.sent_at) > self.ttl_s:
            age = now - header.sent_at
            raise Refused(
                "expired", f"sent {age:.0f}s ago (at most {self.ttl_s:.0f})", kind=header.kind
            )
        with self._lock:
            # Forget the nonces of orders that would now be refused as expired, oldest
            # first: an order costs what expired since the last one. A scan of every
            # nonce kept cost 1 ms an order at 100 orders/s (30,000 kept), 11 us now.
            while self._expiry and now - self._expiry[0][0] > self.ttl_s:
                self._seen.discard(heapq.heappop(self._expiry)[1])
            if header.nonce in self._seen:
                raise Refused("replayed", f"nonce {header.nonce} seen before", kind=header.kind)
            self._seen.add(header.nonce)
            heapq.heappush(self._expiry, (header.sent_at, header.nonce))
        return sealed

    def remembered(self) -> int:
        """How many nonces are kept (those of orders not yet expired)."""
        with self._lock:
            return len(self._seen)

    def _key_for(self, node: str) -> bytes:
        # An order for another node is refused after its signature is checked with ours:
        # whoever signed it with our key is believed about which node it meant.
        return self._key


# -- what both sides build -----------------------------------------------------------


def job_log_dir(log_dir: Path, job_id: int) -> Path:
    """Where every attempt of a job logs."""
    return log_dir / str(job_id)


def attempt_log_path(log_dir: Path, job_id: int, attempt: int, node_rank: int = 0) -> Path:
    """Where an attempt's output goes: the agent writes, the API reads (a data directory
    the nodes share). Each node of a multi-node job writes its own: on a shared directory
    they would otherwise overwrite each other's."""
    suffix = "" if node_rank == 0 else f".node-{node_rank}"
    return job_log_dir(log_dir, job_id) / f"attempt-{attempt}{suffix}.log"


class _RedisChannel(kombu_redis.Channel):
    """kombu's Redis channel, made safe to use after its connection was lost.

    When Redis goes away, Celery (5.7) collects the lost connection before it closes the
    channel. Giving unacknowledged messages back on close, or acknowledging or rejecting
    a task that ran through the outage, then reads the collected connection, raises
    AttributeError and kills the worker (for an agent: its watchdog stops every job on
    the node). All three are skipped on such a channel: the messages stay in Redis's
    unacked set and are delivered again after the visibility timeout, as those of a
    worker that died (tasks are idempotent for that reason).
    """

    _client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        """The channel's one client for commands outside its poll (a publish above all),
        over its pool: kombu builds a new one for each, and with redis-py 8 building one
        (its response callbacks) cost about a fifth of a task's send."""
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
        pool = self.pool
        if self._client is None or self._client.connection_pool is not pool:
            self._client = super()._create_client()  # type: ignore[no-untyped-call]
        return self._client

    def _collected(self) -> bool:
        return self.connection is None or self.connection.client is None

    @property
    def do_restore(self) -> bool:  # type: ignore[override]
        return not self._collected()

    def _skipped(self, action: str, delivery_tag: Any) -> bool:
        if not self._collected():
            return False
        log.warning("not %s message %s: its connection to Redis was lost", action, delivery_tag)
        return True

    def basic_ack(self, delivery_tag: Any, multiple: bool = False) -> None:
        if not self._skipped("acknowledging", delivery_tag):
            super().basic_ack(delivery_tag, multiple=multiple)  # type: ignore[no-untyped-call]

    def basic_reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        if not self._skipped("rejecting", delivery_tag):
            super().basic_reject(delivery_tag, requeue=requeue)  # type: ignore[no-untyped-call]


class RedisTransport(kombu_redis.Transport):
    Channel = _RedisChannel


def celery_app(
    redis_url: str,
    *,
    name: str,
    default_queue: str = REPORTS_QUEUE,
    routes: Mapping[str, Mapping[str, str]] | None = None,
) -> Celery:
    """The Celery app of a scheduler, API or agent process: agents' reports routed to the
    reports queue, plus `routes`."""
    celery = Celery(name, broker=redis_url)
    celery.conf.update(
        task_default_queue=default_queue,
        task_routes={AGENT_REPORT: {"queue": REPORTS_QUEUE}, **(routes or {})},
        task_ignore_result=True,
        # A task is acknowledged only after it ran, so a worker killed mid-task leaves it
        # in Redis for another worker: tasks are idempotent for exactly this reason.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        broker_transport=f"{__name__}:RedisTransport",
        broker_transport_options={"visibility_timeout": 300},
        task_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
    )
    return celery


# -- the installation ---------------------------------------------------------------

# The installation's id, published by the scheduler for agents that were not given it (a
# node added to a cluster is given Redis, not the database): agents name their jobs'
# fences by it (workers/agent/fence.py).
INSTALLATION_KEY = "gpusched:installation"


def wait_installation(redis_client: Any, *, timeout_s: float | None = None) -> str:
    """The installation id the scheduler published (TimeoutError after `timeout_s`)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    said = False
    while True:
        try:
            value = redis_client.get(INSTALLATION_KEY)
        except Exception as exc:
            value = None
            log.warning("Redis unreachable while waiting for the installation id: %s", exc)
        if value:
            return value.decode() if isinstance(value, bytes) else str(value)
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError("no installation id published in Redis")
        if not said:
            log.info("waiting for the scheduler to publish the installation id in Redis")
            said = True
        time.sleep(1.0)
