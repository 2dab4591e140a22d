"""A plan leaves no garbage that only the cyclic collector can free. The live cycle runs
with the collector paused (`app.cycle.run.gc_paused`) and pays, when it is enabled again,
for whatever the cycle left in reference cycles: when each GPU's slot pointed back at its
node, that was every slot and node of the cluster, 7-25 ms after each cycle at 1,000
nodes (docs/benchmarks.md, "The collection after each cycle")."""

from __future__ import annotations

import gc

from app.scheduling import PolicySettings, plan_cycle
from bench.cycle import NOW, build


def test_a_plan_leaves_no_cycles_that_grow_with_the_cluster() -> None:
    snapshot = build(40, 400, 0.5)  # 320 GPUs; backfill and preemptions happen
    settings = PolicySettings()
    plan_cycle(snapshot, now=NOW, settings=settings, seed=0)  # imports and caches settle
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what is unreachable stays in gc.garbage to look at
    try:
        plan = plan_cycle(snapshot, now=NOW, settings=settings, seed=0)
        gc.collect()
        # The core's own objects only: another thread's garbage is no concern here.
        ours = [type(o).__name__ for o in gc.garbage if type(o).__module__.startswith("app.")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()
    assert plan.placements and plan.preemptions
    assert not {"Slot", "NodeState", "Choice"} & set(ours), sorted(set(ours))
    # Before: 320 slots, 40 nodes and their picks; a reservation's closures may remain.
    assert len(ours) < 10, sorted(ours)
