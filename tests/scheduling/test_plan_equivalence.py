"""Speed work must not change decisions: every plan equals the stored golden one.

`plan_golden.json` holds, per seeded snapshot of `plan_corpus.py`, a digest of
each part of the plan (placements, preemptions, pending reasons with kind,
message, queue position and estimated start, queue order) as produced by the
scheduler before the issue #4 speed-ups, plus counts and first entries so a
failure says what moved. Regenerate only for a deliberate change of policy:
`.venv/bin/python -m tests.scheduling.plan_corpus --write`.
"""

from __future__ import annotations

import json
from datetime import timedelta
from functools import cache
from typing import Any

import pytest

from app.scheduling import GpuView, NodeView, PolicySettings, Snapshot, planner
from app.scheduling.filters import GPU_FILTERS, NODE_FILTERS
from app.scheduling.status import OK, Context
from bench.cycle import NOW
from tests.scheduling.plan_corpus import GOLDEN, Case, all_cases, run_case, summary


@cache
def _cases() -> dict[str, Case]:
    return {c[0]: c for c in all_cases()}


@cache
def _golden() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(GOLDEN.read_text())
    return data


def test_golden_covers_every_case() -> None:
    assert sorted(_golden()) == sorted(_cases())


@pytest.mark.parametrize("name", sorted(json.loads(GOLDEN.read_text())))
def test_plan_matches_golden(name: str) -> None:
    got = summary(run_case(_cases()[name]))
    assert got == _golden()[name]


# The build prechecks (filters' `fresh_after` / `idle_before`) may only ever vouch for
# what the filters pass: right at and around each limit, the cycle's verdict per node
# and GPU must be the filters' own.
_EDGES = [0.0, 0.0004, 0.0005, 0.0006, 0.001, 0.0011, 0.002, 1.0]


@pytest.mark.parametrize("delta", [d for e in _EDGES for d in (e, -e)])
@pytest.mark.parametrize("limit", [30.0, 29.9999995, 60.0, 0.0000013, float("inf"), 1e300])
def test_prechecks_agree_with_filters_at_the_limits(delta: float, limit: float) -> None:
    settings = PolicySettings(telemetry_max_age_s=limit, stability_window_s=limit)
    ctx = Context(now=NOW, settings=settings, windows=())
    # Limits beyond any time span (the simulator uses infinity): a day old stands in.
    span = limit + delta if limit < 1e6 else 86_400.0 + delta
    edge = NOW - timedelta(seconds=span)
    long_ago = NOW - timedelta(hours=1)
    nodes = (
        NodeView(
            name="heartbeat-at-edge",
            heartbeat_at=edge,
            gpus=(GpuView(index=0, telemetry_at=NOW, idle_since=long_ago),),
        ),
        NodeView(
            name="gpus-at-edge",
            heartbeat_at=NOW,
            gpus=(
                GpuView(index=0, telemetry_at=edge, idle_since=long_ago),
                GpuView(index=1, telemetry_at=NOW, idle_since=edge),
            ),
        ),
    )
    cycle = planner.build(Snapshot(nodes=nodes), ctx, 0)
    for nv, ns in zip(nodes, cycle.nodes, strict=True):
        want_node = next((st for f in NODE_FILTERS if (st := f(nv, ctx)) is not OK), None)
        assert ns.blocker == want_node
        for g, slot in zip(nv.gpus, ns.slots, strict=True):
            want = want_node or next(
                (st for f in GPU_FILTERS if (st := f(nv, g, ctx)) is not OK), None
            )
            assert slot.blocker == want
