"""Case tables for every filter: each row is one situation and the expected verdict."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from app import compiled_core
from app.scheduling import PolicySettings, ReasonKind, WindowInterval
from app.scheduling.filters import (
    GPU_FILTERS,
    JOB_FILTERS,
    NEVER_FILTERS,
    NODE_FILTERS,
    begin_time,
    enough_gpus,
    foreign_load,
    gpu_healthy,
    gpu_memory,
    gpu_model,
    heartbeat_fresh,
    node_ready,
    offpeak_window,
    telemetry_fresh,
)
from app.scheduling.state import Request, hardware_classes
from app.scheduling.status import Code, Context

from .builders import T0, at, job, node, window

CTX = Context(now=T0, settings=PolicySettings(), windows=())


def test_filter_order_is_written_down_cheapest_first() -> None:
    assert (begin_time.check, offpeak_window.check) == JOB_FILTERS
    assert (node_ready.check, heartbeat_fresh.check) == NODE_FILTERS
    assert (telemetry_fresh.check, gpu_healthy.check, foreign_load.check) == GPU_FILTERS
    assert (gpu_model.never, gpu_memory.never, enough_gpus.never) == NEVER_FILTERS


@pytest.mark.parametrize(
    ("mode", "begin_s", "code"),
    [
        ("now", None, Code.SUCCESS),
        ("at", 60, Code.UNSCHEDULABLE),  # begins in a minute
        ("at", 0, Code.SUCCESS),  # begins exactly now
        ("at", -60, Code.SUCCESS),  # begin time passed
    ],
)
def test_begin_time(mode: str, begin_s: float | None, code: Code) -> None:
    j = job(1, schedule_mode=mode, begin_at=None if begin_s is None else at(begin_s))
    st = begin_time.check(j, CTX)
    assert st.code is code
    if code is Code.UNSCHEDULABLE:
        assert st.kind is ReasonKind.BEGIN_TIME
        assert st.estimated_start == at(begin_s or 0)


NIGHT = window("night", 3600, 7 * 3600)  # opens in 1 h, closes 7 h from now
OPEN = window("night", -3600, 2 * 3600)  # open now, closes in 2 h


@pytest.mark.parametrize(
    ("windows", "runtime", "preemptible", "code", "msg"),
    [
        (
            (NIGHT,),
            600,
            False,
            Code.UNSCHEDULABLE,
            "off-peak window closed",
        ),
        ((OPEN,), 3600, False, Code.SUCCESS, ""),  # 1 h fits in the 2 h left
        ((OPEN,), 3 * 3600, False, Code.UNSCHEDULABLE, "does not fit before"),  # 3 h > 2 h left
        ((OPEN,), 3 * 3600, True, Code.SUCCESS, ""),  # preemptible: may be stopped at close
        ((OPEN,), None, False, Code.SUCCESS, ""),  # unknown runtime: benefit of the doubt
        ((), 60, False, Code.UNSCHEDULABLE, "no opening scheduled"),
    ],
)
def test_offpeak_window(
    windows: tuple[WindowInterval, ...],
    runtime: int | None,
    preemptible: bool,
    code: Code,
    msg: str,
) -> None:
    j = job(1, schedule_mode="offpeak", estimated_runtime_s=runtime, preemptible=preemptible)
    ctx = Context(now=T0, settings=PolicySettings(), windows=windows)
    st = offpeak_window.check(j, ctx)
    assert st.code is code
    assert msg in st.message
    if code is Code.UNSCHEDULABLE:
        assert st.kind is ReasonKind.WINDOW_CLOSED


def test_a_preemptible_offpeak_job_starts_only_if_the_window_outlasts_its_grace() -> None:
    # OPEN closes in 2 h. With 2 h of grace it would be stopped the moment it started
    # (it is stopped its grace before the close), then placed again, in a loop.
    ctx = Context(now=T0, settings=PolicySettings(), windows=(OPEN, NIGHT))
    short = job(1, schedule_mode="offpeak", preemptible=True, grace_s=7199)
    assert offpeak_window.check(short, ctx).ok
    long = job(2, schedule_mode="offpeak", preemptible=True, grace_s=7200)
    st = offpeak_window.check(long, ctx)
    assert (st.code, st.kind) == (Code.UNSCHEDULABLE, ReasonKind.WINDOW_CLOSED)
    # The next opening is a time, given as data (the job's pending_until), not in words.
    assert st.message == (
        "the off-peak window closes within the job's 7200s grace period; waits for the next opening"
    )
    assert st.estimated_start == NIGHT.opens_at


def test_offpeak_window_name_must_match() -> None:
    j = job(1, schedule_mode="offpeak", window="weekend")
    ctx = Context(now=T0, settings=PolicySettings(), windows=(OPEN,))
    assert offpeak_window.check(j, ctx).code is Code.UNSCHEDULABLE
    assert offpeak_window.check(job(2, schedule_mode="offpeak", window="night"), ctx).ok


@pytest.mark.parametrize(
    ("builder", "code", "kind"),
    [
        (node("a").gpus(1), Code.SUCCESS, None),
        (node("a").gpus(1).not_ready(), Code.UNSCHEDULABLE, ReasonKind.NODE_NOT_READY),
        (node("a").gpus(1).drained(), Code.UNSCHEDULABLE, ReasonKind.NODE_NOT_READY),
    ],
)
def test_node_ready(builder, code, kind) -> None:  # type: ignore[no-untyped-def]
    st = node_ready.check(builder.build(), CTX)
    assert (st.code, st.kind) == (code, kind)


@pytest.mark.parametrize(
    ("age", "ok"),
    [(0, True), (30, True), (31, False), (None, False)],  # max age 30 s
)
def test_heartbeat_fresh(age: float | None, ok: bool) -> None:
    st = heartbeat_fresh.check(node("a").gpus(1).heartbeat(age).build(), CTX)
    assert st.ok is ok
    if not ok:
        assert st.kind is ReasonKind.TELEMETRY_STALE


@pytest.mark.parametrize(("age", "ok"), [(0, True), (30, True), (300, False)])
def test_telemetry_fresh(age: float, ok: bool) -> None:
    n = node("a").gpus(1).stale(0, age_s=age).build()
    st = telemetry_fresh.check(n, n.gpus[0], CTX)
    assert st.ok is ok
    assert ok or st.message == "telemetry stale on node a gpu 0"


def test_gpu_healthy() -> None:
    n = node("a").gpus(2).unhealthy(1).build()
    assert gpu_healthy.check(n, n.gpus[0], CTX).ok
    st = gpu_healthy.check(n, n.gpus[1], CTX)
    assert st.kind is ReasonKind.GPU_UNHEALTHY


def test_an_unknown_or_mig_enabled_gpu_is_refused_with_its_own_reason() -> None:
    n = node("a").gpus(1).build()
    unknown = replace(n.gpus[0], healthy=False, unknown=("processes: no permission",))
    st = gpu_healthy.check(n, unknown, CTX)
    assert (st.kind, st.message) == (
        ReasonKind.GPU_UNKNOWN,
        "node a gpu 0 unknown: could not read processes: no permission",
    )
    mig = replace(n.gpus[0], healthy=False, mig_enabled=True)
    assert gpu_healthy.check(n, mig, CTX).kind is ReasonKind.GPU_MIG


@pytest.mark.parametrize(
    ("builder", "ok", "msg"),
    [
        (node("x").gpus(4), True, ""),  # idle of foreign load for an hour
        # 90 % foreign util on gpu 3: busy
        (node("x").gpus(4).foreign(3, 90), False, "GPU busy with foreign process on node x gpu 3"),
        # foreign util 5 % < 10 % threshold, but only for 20 s < 60 s stability window
        (node("x").gpus(4).foreign(3, 5, idle_for_s=20), False, "for only 20s (need 60s)"),
        # 5 % for 61 s: trusted again
        (node("x").gpus(4).foreign(3, 5, idle_for_s=61), True, ""),
        # exactly at the threshold counts as busy (>=)
        (node("x").gpus(4).foreign(3, 10), False, "busy with foreign process"),
    ],
)
def test_foreign_load(builder, ok: bool, msg: str) -> None:  # type: ignore[no-untyped-def]
    n = builder.build()
    st = foreign_load.check(n, n.gpus[3], CTX)
    assert st.ok is ok
    assert msg in st.message
    if not ok:
        assert st.kind is ReasonKind.FOREIGN_PROCESS


def test_own_job_load_is_not_foreign() -> None:
    # Our job just started: 95 % SM util, 70 GB used, but nothing foreign, idle of
    # foreign load for an hour. It must not be judged busy or freshly idle.
    n = node("x").gpus(1).util(95).used_mem(0, 70_000).alloc(0, 500).build()
    assert foreign_load.check(n, n.gpus[0], CTX).ok


CLUSTER = hardware_classes(
    (
        node("a").gpus(8, mem_gb=80, model="A100").build(),
        node("b").gpus(4, mem_gb=24, model="L4").build(),
    )
)


@pytest.mark.parametrize(
    ("req", "code", "kind", "msg"),
    [
        (Request(8, 1, 1000, 0, None), Code.SUCCESS, None, ""),
        (
            Request(9, 1, 1000, 0, None),
            Code.UNRESOLVABLE,
            ReasonKind.NEVER_FITS,
            "no node could ever fit: largest node has 8 GPUs (a)",
        ),
        (Request(4, 2, 1000, 0, None), Code.SUCCESS, None, ""),  # a and b both have 4
        (
            Request(4, 3, 1000, 0, None),
            Code.UNRESOLVABLE,
            ReasonKind.NEVER_FITS,
            "needs 3 nodes with 4 GPUs, cluster has 2",
        ),
        (
            Request(5, 1, 1000, 0, "L4"),
            Code.UNRESOLVABLE,
            ReasonKind.NEVER_FITS,
            "largest node has 4 GPUs (b)",
        ),
        (
            Request(1, 1, 1000, 0, "H100"),
            Code.UNRESOLVABLE,
            ReasonKind.GPU_MODEL_UNAVAILABLE,
            "no GPU of model H100 in the cluster (models: A100, L4)",
        ),
        (
            Request(1, 1, 1000, 90 * 1024, None),
            Code.UNRESOLVABLE,
            ReasonKind.NEVER_FITS,
            "needs 92160 MB, largest GPU has 81920 MB",
        ),
        (
            Request(1, 1, 1000, 30 * 1024, "L4"),
            Code.UNRESOLVABLE,
            ReasonKind.NEVER_FITS,
            "largest GPU has 24576 MB",
        ),
    ],
)
def test_never_fits(req: Request, code: Code, kind: ReasonKind | None, msg: str) -> None:
    st = next((s for f in NEVER_FILTERS if (s := f(req, CLUSTER)).code is Code.UNRESOLVABLE), None)
    if code is Code.SUCCESS:
        assert st is None
    else:
        assert st is not None and st.kind is kind
        assert msg in st.message


def test_slot_filters_memory_share_model() -> None:
    from app.scheduling.filters import gpu_share, reserved, slot_fits
    from app.scheduling.state import NodeState, Slot

    ns = NodeState("a", 0, None)
    s = Slot(ns.name, 0, "A100", 81920, 10_000, 400, None, 40.0, 0.0, frozenset(), 0)
    assert gpu_memory.fits(10_000, s.free_mem)  # exactly the free
    assert not gpu_memory.fits(10_001, s.free_mem)
    assert gpu_share.fits(400, s.free_milli)  # 600 + 400 = 1000
    assert not gpu_share.fits(401, s.free_milli)
    assert not gpu_share.fits(1000, s.free_milli)  # whole GPU: empty
    assert gpu_model.fits("A100", s.model)
    assert not gpu_model.fits("H100", s.model)
    assert gpu_model.on_node("A100", frozenset({"A100"}))
    assert not gpu_model.on_node("H100", frozenset({"A100"}))
    # All of them together on a usable GPU, and the reservation: held GPUs only for the
    # job they are held for (or one the caller may let use them).
    assert slot_fits(400, 10_000, "A100", s, None)
    s.reserved_for = 7
    assert not slot_fits(400, 10_000, "A100", s, None)
    assert slot_fits(400, 10_000, "A100", s, 7)
    assert reserved.fits(None, None) and reserved.fits(7, 7) and not reserved.fits(7, 8)


def test_stale_telemetry_age_is_relative_to_now() -> None:
    later = Context(now=T0 + timedelta(seconds=31), settings=PolicySettings(), windows=())
    n = node("a").gpus(1).build()
    assert not telemetry_fresh.check(n, n.gpus[0], later).ok


@pytest.mark.skipif(
    compiled_core.in_use(), reason="compiled calls do not look the module's names up"
)
def test_the_planner_asks_the_memory_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu_memory.fits is the scheduler's memory test, not a copy of it: loosen the
    filter and the plan follows (plain Python, where a call looks the function up in
    its module; `make test-plain-core` runs it)."""
    from app.scheduling import plan_cycle

    from .builders import snap

    # 10 GB free on each GPU; the job asks 20 GB per GPU.
    s = snap(
        [node("a").gpus(2, mem_gb=80).used_mem(0, 70 * 1024).used_mem(1, 70 * 1024)],
        pending=[job(1, gpus=1, gpu_memory_mb=20 * 1024)],
    )
    before = plan_cycle(s, now=T0)
    assert before.placements == () and before.pending[0].kind is ReasonKind.GPU_MEMORY
    monkeypatch.setattr(gpu_memory, "fits", lambda memory_mb, free_mb: True)
    after = plan_cycle(s, now=T0)
    assert [p.job_id for p in after.placements] == [1]
