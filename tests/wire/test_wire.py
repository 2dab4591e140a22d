"""The wire between scheduler and agents (app.wire): every message parses back from its
dump; a malformed one is refused naming its field; a sealed one is believed only when
signed with the key of the node it names; an agent refuses orders that are old, not for
it, or seen before. Pure: no Redis, no database."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import REGISTRY

from app.nodes.keys import node_key
from app.wire import (
    ORDER_TTL_S,
    ORDER_TYPES,
    REPORT_TYPES,
    AttemptRef,
    Finished,
    GpuInfo,
    GpuProcessReading,
    GpuReading,
    Heartbeat,
    Leaving,
    Malformed,
    Message,
    OrderGate,
    Refused,
    Register,
    RegisterAgain,
    RunJob,
    SetTimeLimit,
    Started,
    StopJob,
    dump,
    note_refused,
    parse,
    seal,
    unseal,
)

SECRET = bytes(range(32))
KEY = {name: node_key(SECRET, name) for name in ("n1", "n2")}
FINISHED = Finished(node="n1", job_id=7, attempt=2, result="SUCCEEDED", exit_code=0, pid=42)
RUN = RunJob(
    node="n1",
    job_id=7,
    attempt=2,
    command=("python", "train.py"),
    env={"LR": "3e-4"},
    gpu_indices=(0, 1),
    master_port=20219,
    world_size=2,
    nproc_per_node=2,
    unix_user="alice",
)

EVERY_MESSAGE: list[Message] = [
    RUN,
    replace(RUN, command="python train.py --lr 1", script="#!/bin/sh\necho hi\n"),
    StopJob(node="n1", job_id=7, attempt=2, reason="preempt", grace_s=0),
    SetTimeLimit(node="n1", job_id=7, attempt=2, max_runtime_s=None),
    Register(
        node="n1",
        hostname="gpu-1",
        labels={"rack": "a"},
        gpus=(GpuInfo(index=0, uuid="GPU-0", model="H100-80GB", memory_total_mb=81559),),
        isolation="cgroup v2",
        grace_s=30.0,
    ),
    Heartbeat(
        node="n1",
        interval_s=2.0,
        gpus=(
            GpuReading(
                index=0,
                uuid="GPU-0",
                util_pct=93.5,
                memory_used_mb=40_000,
                processes=(GpuProcessReading(pid=123, used_memory_mb=39_000, job_id=7),),
                foreign_util_pct=0.0,
            ),
        ),
        running=(AttemptRef(job_id=8, attempt=1),),
        recent=(FINISHED,),
        taken_at=1_764_000_000.25,
        unusable_accounts={"dave": "no such account on this node"},
    ),
    Started(node="n1", job_id=7, attempt=2, pid=42),
    FINISHED,
    Finished(
        node="n1",
        job_id=7,
        attempt=3,
        result="REFUSED",
        account="dave",
        account_reason="no such account on this node",
        message="not started",
    ),
    Leaving(node="n1", recent=(FINISHED,), taken_at=1_764_000_000.5),
    RegisterAgain(node="n1"),
]


@pytest.mark.parametrize("message", EVERY_MESSAGE, ids=lambda m: m.KIND)
def test_every_message_parses_back_from_its_dump(message: Message) -> None:
    assert parse(type(message), dump(message)) == message
    assert {**ORDER_TYPES, **REPORT_TYPES}[message.KIND] is type(message)


def _malformed(cls: type[Any], data: dict[str, Any]) -> Malformed:
    with pytest.raises(Malformed) as caught:
        parse(cls, json.dumps(data))
    return caught.value


def test_a_malformed_message_is_refused_naming_its_field() -> None:
    finished = json.loads(dump(FINISHED))
    assert _malformed(Finished, {k: v for k, v in finished.items() if k != "job_id"}).field == (
        "job_id"
    )
    assert _malformed(Finished, {**finished, "job_id": "7"}).field == "job_id"  # no coercion
    assert _malformed(Finished, {**finished, "attempt": 0}).field == "attempt"
    wrong = _malformed(Finished, {**finished, "result": "DONE"})
    assert wrong.field == "result" and "SUCCEEDED" in wrong.reason
    beat = json.loads(dump(EVERY_MESSAGE[5]))
    assert _malformed(Heartbeat, {**beat, "taken_at": "12:00"}).field == "taken_at"
    beat["gpus"][0]["processes"][0]["pid"] = "123"
    assert _malformed(Heartbeat, beat).field == "gpus[0].processes[0].pid"
    run = json.loads(dump(RUN))
    assert _malformed(RunJob, {**run, "gpu_indices": [0, -1]}).field == "gpu_indices[1]"
    assert str(_malformed(RunJob, {**run, "master_port": None})).startswith("master_port: ")
    with pytest.raises(Malformed) as caught:
        parse(StopJob, "{not json")
    assert caught.value.field == "(message)"


def test_a_field_a_newer_peer_adds_is_ignored() -> None:
    data = {**json.loads(dump(FINISHED)), "isolation": "cgroup v2"}
    assert parse(Finished, json.dumps(data)) == FINISHED


def _refused(fields: dict[str, Any], **kwargs: Any) -> Refused:
    kwargs.setdefault("types", REPORT_TYPES)
    kwargs.setdefault("key_for", KEY.__getitem__)
    with pytest.raises(Refused) as caught:
        unseal(fields, **kwargs)
    return caught.value


def test_a_report_is_believed_only_when_signed_by_the_node_it_names() -> None:
    sealed = seal(FINISHED, key=KEY["n1"])
    assert unseal(sealed, types=REPORT_TYPES, key_for=KEY.__getitem__).message == FINISHED
    # What a job that reached Redis could send: the report itself, unsigned.
    assert _refused({"payload": json.loads(dump(FINISHED))}).reason == "unsigned"
    # Signed by another node's key (n2 speaking for n1).
    forged = _refused(seal(FINISHED, key=KEY["n2"]))
    assert (forged.reason, forged.kind) == ("bad_signature", "finished")
    # A signed body changed on the way (here: the result).
    tampered = {**sealed, "body": sealed["body"].replace("SUCCEEDED", "FAILED")}
    assert _refused(tampered).reason == "bad_signature"
    # An order offered where reports are taken: refused before any key is looked at.
    assert _refused(seal(RUN, key=KEY["n1"])).reason == "wrong_kind"
    # A header naming n2 around a body naming n1, all signed with n2's key.
    header = json.loads(seal(FINISHED, key=KEY["n2"])["header"]) | {"node": "n2"}
    relabelled = _resealed(header, sealed["body"], KEY["n2"])
    assert _refused(relabelled).reason == "wrong_node"
    # A heartbeat from n1 carrying a finish it says happened on n2.
    beat = Heartbeat(node="n1", recent=(replace(FINISHED, node="n2"),))
    smuggled = _refused(seal(beat, key=KEY["n1"]))
    assert smuggled.reason == "wrong_node" and "recent[0].node" in smuggled.detail


def _resealed(header: dict[str, Any], body: str, key: bytes) -> dict[str, str]:
    import hashlib
    import hmac

    text = json.dumps(header, separators=(",", ":"))
    sig = hmac.new(key, f"{text}\n{body}".encode(), hashlib.sha256).hexdigest()
    return {"header": text, "body": body, "sig": sig}


def test_a_malformed_signed_message_is_refused_naming_its_field() -> None:
    good = seal(FINISHED, key=KEY["n1"])
    body = json.loads(good["body"]) | {"exit_code": "zero"}
    header = json.loads(good["header"])
    refused = _refused(_resealed(header, json.dumps(body), KEY["n1"]))
    assert refused.reason == "malformed" and refused.detail.startswith("exit_code: ")
    header_only = _refused({**good, "header": json.dumps({**header, "sent_at": "now"})})
    assert header_only.reason == "malformed" and "header.sent_at" in header_only.detail


def test_an_agent_obeys_an_order_once_and_only_if_meant_for_it() -> None:
    gate = OrderGate(node="n1", key=KEY["n1"])
    now = time.time()
    order = seal(RUN, key=KEY["n1"], now=now)
    assert gate.open(order, now=now + 1).message == RUN
    with pytest.raises(Refused) as replayed:
        gate.open(order, now=now + 2)
    assert replayed.value.reason == "replayed"

    def refusal(fields: dict[str, str], at: float = now) -> str:
        with pytest.raises(Refused) as caught:
            gate.open(fields, now=at)
        return caught.value.reason

    assert refusal({"payload": json.loads(dump(RUN))}) == "unsigned"
    assert refusal(seal(RUN, key=KEY["n2"])) == "bad_signature"  # signed for another node
    n2_order = replace(RUN, node="n2")
    assert refusal(seal(n2_order, key=KEY["n2"])) == "bad_signature"  # n2's, sent to n1
    assert refusal(seal(n2_order, key=KEY["n1"])) == "wrong_node"
    assert refusal(seal(FINISHED, key=KEY["n1"])) == "wrong_kind"  # a report is no order
    old = seal(RUN, key=KEY["n1"], now=now - ORDER_TTL_S - 1)
    assert refusal(old) == "expired"
    ahead = seal(RUN, key=KEY["n1"], now=now + ORDER_TTL_S + 60)
    assert refusal(ahead) == "expired"


def test_an_agent_forgets_an_order_only_once_it_would_be_refused_as_expired() -> None:
    gate = OrderGate(node="n1", key=KEY["n1"])
    now = time.time()
    # Sent 100 s apart, the later first: the gate keeps what it has not seen expire,
    # whatever order they arrived in.
    later, earlier = (seal(RUN, key=KEY["n1"], now=now + at) for at in (100, 0))
    gate.open(later, now=now + 100)
    gate.open(earlier, now=now + 101)
    assert gate.remembered() == 2
    for order in (later, earlier):
        with pytest.raises(Refused, match="seen before"):
            gate.open(order, now=now + ORDER_TTL_S - 1)
    # Past the earlier one's lifetime, the next order opened lets it go, not the later.
    gate.open(seal(RUN, key=KEY["n1"], now=now + ORDER_TTL_S + 2), now=now + ORDER_TTL_S + 2)
    assert gate.remembered() == 2
    with pytest.raises(Refused, match="seen before"):
        gate.open(later, now=now + ORDER_TTL_S + 3)
    with pytest.raises(Refused) as expired:
        gate.open(earlier, now=now + ORDER_TTL_S + 3)
    assert expired.value.reason == "expired"


def test_a_refusal_is_counted_by_kind_and_reason() -> None:
    labels = {"kind": "finished", "reason": "bad_signature"}

    def count() -> float:
        return REGISTRY.get_sample_value("gpusched_refused_messages_total", labels) or 0.0

    before = count()
    note_refused(_refused(seal(FINISHED, key=KEY["n2"])), receiver="test")
    assert count() == before + 1
