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
    out = json.loads(result.output)
    assert out["policy"] == "default" and out["jobs"] == 3 and out["skipped"] == 1
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
