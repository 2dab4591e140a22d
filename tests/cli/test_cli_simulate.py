import json

import pytest
from typer.testing import CliRunner

from app.cli import app

TRACE = """job_id,user,vc,jobname,gpu_num,gpu_milli,submit_time,duration
1,u1,a,resnet,4,1000,0,100
2,u2,b,bert,4,1000,0,100
3,u1,a,resnet,8,1000,10,50
4,u3,b,huge,64,1000,20,10
"""


def test_simulate_prints_json_with_bounds(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    result = CliRunner().invoke(
        app, ["simulate", "--trace", str(trace), "--nodes", "1", "--gpus-per-node", "8", "--json"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["policy"] == "default" and out["jobs"] == 3 and out["skipped"] == 1
    # The job that can never fit is named, not only counted: on stderr and in the JSON.
    assert out["skipped_jobs"] == ["4"]
    assert result.stderr == "skipped 1 job that can never fit 1 x 8 GPUs: 4 (64 GPUs)\n"
    # Jobs 1 and 2 share the node from t=0 (JCT 100 each); job 3 needs all 8 GPUs and
    # starts at 100 when both end: JCT 140. Mean 113.3; the bound is the mean duration.
    assert round(out["avg_jct_s"], 1) == round((100 + 100 + 140) / 3, 1)
    assert out["lower_bounds"]["avg_jct_s"] == (100 + 100 + 50) / 3
    # Counting arrivals (app/simulator/bounds.py, 8 GPU-s/s, least work first, ties by
    # order): mean busy times 25, 75 and 125; (225 + 250 / 2 - 10) / 3 = 113.3, which this
    # schedule reaches. Makespan: 1,200 GPU-s from t=0 on 8 GPUs = 150, as it ends.
    assert out["lower_bounds"]["avg_jct_s_with_arrivals"] == pytest.approx(340 / 3)
    assert out["lower_bounds"]["makespan_s_with_arrivals"] == pytest.approx(150)
    assert out["makespan_s"] == pytest.approx(150)
    assert set(out) >= {
        "p50_jct_s",
        "p99_jct_s",
        "avg_queue_s",
        "makespan_s",
        "utilization",
        "preemptions",
        "per_vc",
    }


def test_simulate_reports_bad_input(tmp_path):
    missing = CliRunner().invoke(
        app,
        ["simulate", "--trace", str(tmp_path / "no.csv"), "--nodes", "1", "--gpus-per-node", "8"],
    )
    assert missing.exit_code == 2 and "no trace file" in missing.output
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    bad = CliRunner().invoke(
        app,
        [
            "simulate",
            "--trace",
            str(trace),
            "--nodes",
            "1",
            "--gpus-per-node",
            "8",
            "--policy",
            "random",
        ],
    )
    assert bad.exit_code == 2 and "unknown policy" in bad.output


# 1 GPU: under LAS, j1 stops j0 at 5000 (see tests/simulator/test_simulator.py).
LAS_TRACE = """job_id,user,vc,jobname,gpu_num,gpu_milli,submit_time,duration
j0,u,v,x,1,1000,0,10000
j1,u,v,y,1,1000,5000,100
"""


def simulate_cli(tmp_path, *args, trace=LAS_TRACE, gpus=1):
    path = tmp_path / "t.csv"
    path.write_text(trace)
    base = ["simulate", "--trace", str(path), "--nodes", "1", "--gpus-per-node", str(gpus)]
    return CliRunner().invoke(app, [*base, *args])


@pytest.mark.parametrize(
    ("cost", "seconds"), [(None, 300), ("0", 0), ("5m", 300), ("1h", 3600), ("90", 90)]
)
def test_preemption_cost_option(tmp_path, cost, seconds):
    args = ["--policy", "las", "--json"] + (["--preemption-cost", cost] if cost else [])
    result = simulate_cli(tmp_path, *args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["preemptions"] == 1 and out["preemption_cost_s"] == seconds
    assert out["preemption_lost_gpu_h"] == pytest.approx(seconds / 3600)
    assert out["avg_jct_s"] == pytest.approx((100 + 10_100 + seconds) / 2)


def test_preemption_cost_option_rejects_a_non_duration(tmp_path):
    result = simulate_cli(tmp_path, "--preemption-cost", "soon")
    assert result.exit_code == 2
    assert "--preemption-cost: 'soon': expected seconds or a duration" in result.output


@pytest.mark.parametrize(("fraction", "preemptible", "preemptions"), [(0, 0, 0), (1, 2, 1)])
def test_preemptible_fraction_option(tmp_path, fraction, preemptible, preemptions):
    args = ["--policy", "las", "--json", "--preemptible-fraction", str(fraction)]
    result = simulate_cli(tmp_path, *args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert (out["preemptible_jobs"], out["preemptions"]) == (preemptible, preemptions)


def test_preemptible_fraction_out_of_range_is_refused(tmp_path):
    result = simulate_cli(tmp_path, "--preemptible-fraction", "1.5")
    assert result.exit_code == 2 and "--preemptible-fraction" in result.output


def test_every_policy_row_shows_its_jct_over_the_bound_with_arrivals(tmp_path):
    table = simulate_cli(tmp_path, "--policy", "all")
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    head = next(line for line in lines if line.startswith("policy"))
    for column in ("vs bound", "frag", "preempt", "lost GPU-h"):
        assert column in head
    results = json.loads(simulate_cli(tmp_path, "--policy", "all", "--json").stdout)
    assert len(results) == 6
    for r in results:
        row = next(line for line in lines if line.split()[0] == r["policy"])
        ratio = r["avg_jct_s"] / r["lower_bounds"]["avg_jct_s_with_arrivals"]
        assert f" {ratio:.2f}x " in row, (r["policy"], row)
    assert "preemption cost 300 s, 2 jobs preemptible (100%)" in table.stdout


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("9,u,v,n,0,1000,0,10", "line 4: gpu_num: 0: a job needs at least 1 GPU"),
        ("9,u,v,n,1,1000,-1,10", "line 4: submit_time: -1 must be a finite number of seconds"),
        ("9,u,v,n,1,1000,0,-10", "line 4: duration: -10 must be a finite number of seconds"),
        ("9,u,v,n,1,2000,0,10", "line 4: gpu_milli: 2000 is outside 1..1000"),
        ("9,u,v,n,1,1000,0", "line 4: 7 fields where the header has 8"),
        ("9,u,,n,1,1000,0,10", "line 4: vc: missing (the field is empty)"),
    ],
)
def test_a_bad_trace_row_exits_2_naming_line_and_field(tmp_path, row, message):
    result = simulate_cli(tmp_path, trace=LAS_TRACE + row + "\n")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: trace {tmp_path / 't.csv'}, {message}")


def test_skipped_jobs_are_listed_in_table_mode_too(tmp_path):
    result = simulate_cli(tmp_path, "--policy", "all", trace=TRACE, gpus=4)
    assert result.exit_code == 0, result.output
    # Once, not once per policy; the table itself goes to stdout.
    assert (
        result.stderr == "skipped 2 jobs that can never fit 1 x 4 GPUs: 3 (8 GPUs), 4 (64 GPUs)\n"
    )
    assert "skipped" not in result.stdout
