"""Simulator on tiny hand-made traces with hand-computed results."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import app
from app.simulator import TraceJob, engine, read_trace, shape_for, simulate
from app.simulator.cli import run_simulation_cli
from app.simulator.engine import percentile


def tj(i: int, name: str, gpus: int, submit: float, duration: float, vc: str = "v") -> TraceJob:
    return TraceJob(f"j{i}", "u", vc, name, gpus, 1000, submit, duration)


# 1 node x 2 GPUs, FIFO:
#   A (2 GPUs) t=0..100; B (1 GPU) and C (1 GPU) arrive at 10 and 20 while A runs,
#   both start at 100: B ends 150, C ends 130.
#   JCT: A 100, B 140, C 110 -> avg 116.67, p50 110, p99 140; queue 0, 90, 80 -> 56.67
#   makespan 150; GPU-s 200 + 50 + 30 = 280 -> utilisation 280 / (2 x 150) = 0.9333
#   bounds: avg JCT >= mean(100, 50, 30) = 60; makespan >= max(100, 280 / 2) = 140
#   with arrivals (app/simulator/bounds.py), 2 GPU-s/s, least work first: A 0..10, B
#   10..20, C 20..35, B 35..50, A 50..140; mean busy times A 17,200 / 200 = 86, B 1,575 / 50
#   = 31.5, C 825 / 30 = 27.5; (145 + 90 halves of durations - 30 arrivals) / 3 = 68.33;
#   makespan: no arrival after 0 leaves more than 140
TRACE = [tj(0, "A", 2, 0, 100), tj(1, "B", 1, 10, 50), tj(2, "C", 1, 20, 30, vc="w")]


def test_fifo_hand_computed() -> None:
    r = simulate(TRACE, nodes=1, gpus_per_node=2, policy="fifo")
    assert r.jobs == 3 and r.skipped == 0
    assert r.avg_jct_s == pytest.approx(350 / 3)
    assert (r.p50_jct_s, r.p99_jct_s) == (110, 140)
    assert r.avg_queue_s == pytest.approx(170 / 3)
    assert r.makespan_s == 150
    assert r.utilization == pytest.approx(280 / 300)
    assert r.preemptions == 0
    assert r.per_vc == {"v": pytest.approx(120.0), "w": pytest.approx(110.0)}
    assert r.lower_bounds == {
        "avg_jct_s": pytest.approx(60.0),
        "makespan_s": 140.0,
        "avg_jct_s_with_arrivals": pytest.approx(205 / 3),
        "makespan_s_with_arrivals": 140.0,
    }


def test_to_json_has_exactly_the_documented_keys() -> None:
    r = simulate(TRACE, nodes=1, gpus_per_node=2, policy="default")
    assert set(r.to_json()) == {
        "policy",
        "jobs",
        "skipped",
        "skipped_jobs",
        "avg_jct_s",
        "p50_jct_s",
        "p99_jct_s",
        "avg_queue_s",
        "makespan_s",
        "utilization",
        "preemptions",
        "preemption_cost_s",
        "preemption_lost_gpu_h",
        "preemptible_jobs",
        "fragmentation",
        "per_vc",
        "lower_bounds",
        "exact_runtimes",
        "offpeak_jobs",
        "window_preemptions",
        "energy_wh",
        "cost",
        "cost_at_peak",
    }
    json.dumps(r.to_json())


# 1 GPU. "short" (5 s) finishes first, so its runtime is known. Two more arrive while
# "long" j1 runs 6..56: j2 "long" (50 s, submitted 7) and j3 "short" (5 s, submitted 8).
# At 56 the history says long = 50 s, short = 5 s.
#   FIFO: j2 56..106, j3 106..111: JCT 5, 50, 99, 103 -> avg 64.25
#   SJF : j3 56..61,  j2 61..111: JCT 5, 50, 104, 53 -> avg 53.0
SJF_TRACE = [
    tj(0, "short", 1, 0, 5),
    tj(1, "long", 1, 6, 50),
    tj(2, "long", 1, 7, 50),
    tj(3, "short", 1, 8, 5),
]


@pytest.mark.parametrize(("policy", "avg"), [("fifo", 64.25), ("sjf", 53.0)])
def test_sjf_uses_predicted_runtime(policy: str, avg: float) -> None:
    r = simulate(SJF_TRACE, nodes=1, gpus_per_node=1, policy=policy)
    assert r.avg_jct_s == pytest.approx(avg)


# 1 GPU, SJF. A blocker runs 0..100; "x" (50 s) arrives at 10 and "y" (5 s) at 20. No job
# has finished when they are ordered at 100, so from history both are unknown and the older
# goes first: x 100..150, y 150..155 -> JCT 100, 140, 135 -> avg 125.
# Told the true durations: y 100..105, x 105..155 -> JCT 100, 145, 85 -> avg 110.
UNKNOWN_RUNTIMES = [tj(0, "b", 1, 0, 100), tj(1, "x", 1, 10, 50), tj(2, "y", 1, 20, 5)]


@pytest.mark.parametrize(("exact", "avg"), [(False, 125.0), (True, 110.0)])
def test_exact_runtimes_are_told_to_the_scheduler(exact: bool, avg: float) -> None:
    r = simulate(UNKNOWN_RUNTIMES, nodes=1, gpus_per_node=1, policy="sjf", exact_runtimes=exact)
    assert r.avg_jct_s == pytest.approx(avg)
    assert r.to_json()["exact_runtimes"] is exact


def test_cli_exact_runtimes(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    rows = ["job_id,user,vc,jobname,gpu_num,gpu_milli,submit_time,duration"]
    rows += [
        f"{j.job_id},u,v,{j.jobname},1,1000,{j.submit_time},{j.duration}" for j in UNKNOWN_RUNTIMES
    ]
    trace.write_text("\n".join(rows) + "\n")
    args = ["simulate", "--trace", str(trace), "--nodes", "1", "--gpus-per-node", "1"]
    result = CliRunner().invoke(app, [*args, "--policy", "sjf", "--exact-runtimes", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["avg_jct_s"] == pytest.approx(110.0)
    table = CliRunner().invoke(app, [*args, "--exact-runtimes"])
    assert table.exit_code == 0, table.output
    assert "exact runtimes (clairvoyant)" in table.output


@pytest.mark.parametrize("cost", [0, 300, 4000])
def test_las_preempts_long_runner_for_newcomer(cost: float) -> None:
    # j0 runs from 0 on the only GPU; at 5000 it has 5000 GPU-s >= 3600 (LAS queue 1),
    # j1 arrives (queue 0) and preempts it: j1 5000..5100, j0 resumes 5100..10100 plus
    # the preemption's cost (restart and lost work). j0 waited 100 s of its JCT.
    trace = [tj(0, "x", 1, 0, 10_000), tj(1, "y", 1, 5000, 100)]
    r = simulate(trace, nodes=1, gpus_per_node=1, policy="las", preemption_cost_s=cost)
    assert r.preemptions == 1
    assert sorted(r.jcts) == [100, 10_100 + cost]
    assert r.preemption_lost_gpu_h == pytest.approx(cost / 3600)
    assert r.avg_queue_s == pytest.approx(100 / 2)
    assert r.utilization == pytest.approx(10_100 / (10_100 + cost))  # the trace's work only
    fifo = simulate(trace, nodes=1, gpus_per_node=1, policy="fifo", preemption_cost_s=cost)
    assert fifo.preemptions == 0 and sorted(fifo.jcts) == [5100, 10_000]
    assert fifo.preemption_lost_gpu_h == 0


def test_time_scale_compresses_arrivals_only() -> None:
    # arrivals 0, 10, 20 become 0, 5, 10; durations unchanged -> B, C still start at 100
    r = simulate(TRACE, nodes=1, gpus_per_node=2, policy="fifo", time_scale=2.0)
    assert sorted(r.jcts) == [100, 100 - 10 + 30, 100 - 5 + 50]


def test_too_large_jobs_are_skipped_and_reported() -> None:
    trace = [*TRACE, tj(9, "huge", 64, 0, 10)]
    r = simulate(trace, nodes=2, gpus_per_node=2, policy="fifo")
    assert r.skipped == 1 and r.skipped_ids == ["j9"] and r.jobs == 3
    assert r.to_json()["skipped_jobs"] == ["j9"]


def test_multi_node_gang_jobs_run() -> None:
    # 16 GPUs on 8-GPU nodes: one 2-node gang, whole cluster, 100 s.
    r = simulate([tj(0, "big", 16, 0, 100)], nodes=2, gpus_per_node=8, policy="default")
    assert r.jobs == 1 and r.avg_jct_s == 100 and r.utilization == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("gpus", "gpn", "shape"), [(4, 8, (1, 4)), (16, 8, (2, 8)), (12, 8, (2, 6)), (20, 8, (3, 7))]
)
def test_shape_for(gpus: int, gpn: int, shape: tuple[int, int]) -> None:
    assert shape_for(gpus, gpn) == shape


def test_percentile_nearest_rank() -> None:
    assert percentile([5, 1, 3, 2, 4], 50) == 3
    assert percentile([1, 2, 3, 4], 99) == 4
    assert percentile([], 50) == 0.0


def test_shared_gpu_jobs_share() -> None:
    trace = [
        TraceJob("a", "u", "v", "n", 1, 500, 0, 100),
        TraceJob("b", "u", "v", "n", 1, 500, 0, 100),
    ]
    r = simulate(trace, nodes=1, gpus_per_node=1, policy="fifo")
    assert sorted(r.jcts) == [100, 100]  # both on one GPU at once
    assert r.utilization == pytest.approx(1.0)


def _write(tmp_path: Path) -> Path:
    p = tmp_path / "t.csv"
    rows = ["job_id,user,vc,jobname,gpu_num,gpu_milli,submit_time,duration"]
    rows += [
        f"{j.job_id},{j.user},{j.vc},{j.jobname},{j.gpu_num},{j.gpu_milli},{j.submit_time},{j.duration}"
        for j in reversed(TRACE)
    ]
    p.write_text("\n".join(rows) + "\n")
    return p


def test_read_trace_sorts_by_submit(tmp_path: Path) -> None:
    jobs = read_trace(_write(tmp_path))
    assert [j.job_id for j in jobs] == ["j0", "j1", "j2"]
    assert jobs[0] == TRACE[0]


def test_jobs_that_can_never_fit_are_named_for_stderr_and_in_the_json(tmp_path: Path) -> None:
    path = _write(tmp_path)
    with path.open("a") as fh:
        fh.write("big,u,v,n,4,1000,5,10\nhuge,u,v,n,9,1000,6,10\n")
    out = run_simulation_cli(path, 1, 2, "fifo", 1.0, as_json=True)
    assert out.notes == (
        "skipped 2 jobs that can never fit 1 x 2 GPUs: big (4 GPUs), huge (9 GPUs)",
    )
    payload = json.loads(out.text)
    assert (payload["skipped"], payload["skipped_jobs"]) == (2, ["big", "huge"])


def test_read_trace_rejects_missing_columns(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("job_id,user\n1,u\n")
    with pytest.raises(ValueError, match="missing columns"):
        read_trace(p)


def test_cli_table_and_json(tmp_path: Path) -> None:
    path = _write(tmp_path)
    out = run_simulation_cli(path, 1, 2, "fifo", 1.0, as_json=True)
    assert json.loads(out.text)["avg_jct_s"] == pytest.approx(350 / 3)
    assert out.notes == ()  # nothing skipped
    table = run_simulation_cli(path, 1, 2, None, 1.0, as_json=False).text
    rows = ("default", "fifo", "priority", "fair-share", "sjf", "las", "lower bound", "w/ arrivals")
    for row in rows:
        assert row in table
    with pytest.raises(ValueError, match="unknown policy"):
        run_simulation_cli(path, 1, 2, "nope", 1.0, as_json=False)


def test_shared_trace_smoke() -> None:
    path = Path(__file__).resolve().parents[3] / "shared" / "traces" / "philly_ed69ec.csv"
    if not path.exists():
        pytest.skip("shared traces not present")
    jobs = read_trace(path)[:200]
    r = simulate(jobs, nodes=2, gpus_per_node=8, policy="default", time_scale=4.0)
    assert r.jobs == 200
    assert r.avg_jct_s >= r.lower_bounds["avg_jct_s"] - 1e-6
    assert r.makespan_s >= r.lower_bounds["makespan_s"] - 1e-6 or r.makespan_s > 0
    assert 0 < r.utilization <= 1.0


# One GPU, default policy. s0 (10 s) finishes first, so "short" jobs are predicted at 10 s;
# "long" has no history, so it counts as the 24 h default. A blocker holds the GPU from 20
# to 100,020. L ("long", 1,000 s) arrives at 30, S1 ("short", 10 s) at 50,000.
# At 100,020 L has waited 99,990 s and S1 50,020 s.
#   24 h guard: L starves and goes first: L 100,020-101,020 (JCT 100,990), S1 -101,030
#     (51,030). avg = (10 + 100,000 + 100,990 + 51,030) / 4 = 63,007.5
#   guard off: S1 is shorter: S1 100,020-100,030 (50,030), L -101,030 (101,000).
#     avg = (10 + 100,000 + 50,030 + 101,000) / 4 = 62,760
STARVING = [
    tj(0, "short", 1, 0, 10),
    tj(1, "blocker", 1, 20, 100_000),
    tj(2, "long", 1, 30, 1000),
    tj(3, "short", 1, 50_000, 10),
]


# None preemptible: the hand-computed values are for the order alone (the default preempts
# the blocker for later LAS-queue-0 arrivals otherwise).
@pytest.mark.parametrize(("limit", "avg"), [("24h", 63_007.5), ("1d", 63_007.5), ("0", 62_760)])
def test_cli_starvation_after(tmp_path: Path, limit: str, avg: float) -> None:
    trace = tmp_path / "t.csv"
    rows = ["job_id,user,vc,jobname,gpu_num,gpu_milli,submit_time,duration"]
    rows += [f"{j.job_id},u,v,{j.jobname},1,1000,{j.submit_time},{j.duration}" for j in STARVING]
    trace.write_text("\n".join(rows) + "\n")
    args = [
        "simulate",
        "--trace",
        str(trace),
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--json",
        "--preemptible-fraction",
        "0",
    ]
    result = CliRunner().invoke(app, [*args, "--starvation-after", limit])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["avg_jct_s"] == pytest.approx(avg)


def test_cli_rejects_a_bad_starvation_limit(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,user,vc,jobname,gpu_num,gpu_milli,submit_time,duration\n")
    args = ["simulate", "--trace", str(trace), "--nodes", "1", "--gpus-per-node", "1"]
    result = CliRunner().invoke(app, [*args, "--starvation-after", "soon"])
    assert result.exit_code == 2
    assert "--starvation-after: 'soon': expected seconds or a duration" in result.output


def test_plans_run_with_the_garbage_collector_paused(monkeypatch: pytest.MonkeyPatch) -> None:
    # As in the live cycle: the collector's passes over a replay's large heap cost 12 %
    # of the Alibaba trace's replay. It is on again between plans, and after the run.
    during: list[bool] = []
    plan = engine.plan_cycle

    def spy(*args: object, **kwargs: object) -> object:
        during.append(gc.isenabled())
        return plan(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "plan_cycle", spy)
    assert gc.isenabled()
    simulate(TRACE, nodes=1, gpus_per_node=2, policy="fifo")
    assert during and not any(during)
    assert gc.isenabled()
    gc.disable()
    try:
        simulate(TRACE, nodes=1, gpus_per_node=2, policy="fifo")
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()


def test_an_event_that_frees_too_little_for_every_waiting_job_costs_no_plan() -> None:
    # 1 node x 2 GPUs: A holds GPU 0 until 1000; three 0.3-GPU jobs share GPU 1 and end
    # at 100, 200, 300; W (2 GPUs) arrives at 1 and can start only when A ends.
    trace = [
        tj(0, "A", 1, 0, 1000),
        *(TraceJob(f"s{i}", "u", "v", "s", 1, 300, 0, 100 * i) for i in (1, 2, 3)),
        tj(4, "W", 2, 1, 50),
    ]
    r = simulate(trace, nodes=1, gpus_per_node=2, policy="fifo")
    assert sorted(r.jcts) == [100, 200, 300, 1000, 1049]
    # Planned at 0 (all but W placed) and at 1000 (W placed): W's arrival and the ends
    # at 100, 200 and 300 leave no 2 whole GPUs free, so a plan then would place nothing.
    assert r.cycles == 2
