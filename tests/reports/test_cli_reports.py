"""`gpusched estimate`, `seff` and `usage` against a live server."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

from app.db import utcnow
from tests.foundation.builders import add_node
from tests.reports.builders import add_gpus, add_run, add_samples


def test_seff_prints_figures_and_advice(cli) -> None:  # type: ignore[no-untyped-def]
    gpus = add_gpus(cli.factory, "n1", gpus=4)
    start = utcnow() - timedelta(hours=2)
    run = add_run(cli.factory, gpu_ids=gpus, start=start, end=start + timedelta(hours=1))
    add_samples(cli.factory, run, count=30, util=lambda g, _i: 96.0 if g == 0 else 0.0)
    result = cli("seff", str(run.job_id))
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"{run.job_id} (train)" in out
    assert "GPU-hours" in out and "4.00" in out
    assert "n1/gpu1 (idle)" in out
    assert "idle_gpus" in out and "DistributedDataParallel" in out


def test_seff_json(cli) -> None:  # type: ignore[no-untyped-def]
    gpus = add_gpus(cli.factory, "n1", gpus=1)
    start = utcnow() - timedelta(hours=2)
    run = add_run(cli.factory, gpu_ids=gpus, start=start, end=start + timedelta(hours=1))
    add_samples(cli.factory, run, count=10, util=5.0)
    result = cli("seff", str(run.job_id), "--json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["job_id"] == run.job_id
    assert [f["code"] for f in body["flags"]] == ["low_utilisation"]


def test_seff_unknown_job_exits_1_with_the_servers_message(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("seff", "424242")
    assert result.exit_code == 1
    assert "no job 424242" in result.stderr
    assert result.stdout == ""


def test_seff_of_another_projects_job_is_refused(cli) -> None:  # type: ignore[no-untyped-def]
    gpus = add_gpus(cli.factory, "n1", gpus=1)
    start = utcnow() - timedelta(hours=2)
    run = add_run(cli.factory, gpu_ids=gpus, start=start, end=start + timedelta(hours=1))
    result = cli("seff", str(run.job_id), user="bob")
    assert result.exit_code == 1 and "not a member" in result.stderr


def test_usage_table_and_csv(cli) -> None:  # type: ignore[no-untyped-def]
    gpus = add_gpus(cli.factory, "n1", gpus=2)
    start = utcnow() - timedelta(hours=3)
    run = add_run(cli.factory, gpu_ids=gpus, start=start, end=start + timedelta(hours=1))
    add_samples(cli.factory, run, count=30, util=10.0)
    table = cli("usage", "--project", "ml", "--since", "7d")
    assert table.exit_code == 0, table.output
    assert "1 job(s) (SUCCEEDED 1); 2.00 GPU-hours" in table.output
    assert "Most wasteful jobs" in table.output
    exported = cli("usage", "--project", "ml", "--since", "1d", "--csv")
    assert exported.exit_code == 0, exported.output
    rows = list(csv.DictReader(io.StringIO(exported.stdout)))
    assert [int(r["job_id"]) for r in rows] == [run.job_id]
    assert rows[0]["flags"] == "low_utilisation"
    bad = cli("usage", "--since", "last week")
    assert bad.exit_code == 2 and "--since" in bad.stderr
    other = cli("usage", "--project", "cv")
    assert other.exit_code == 1 and "not a member" in other.stderr


def test_estimate_prints_breakdown_fits_and_suggestions(cli) -> None:  # type: ignore[no-untyped-def]
    add_node(cli.factory, "h1", gpus=8)
    result = cli(
        "estimate",
        "--parameters",
        "7e9",
        "--precision",
        "mixed",
        "--optimizer",
        "adam",
        "--micro-batch",
        "1",
        "--tokens",
        "1e12",
    )
    assert result.exit_code == 0, result.output
    out = result.output
    assert "7.00B parameters (shape assumed)" in out
    for word in ("optimizer_states", "activations", "total", "H100-80GB", "Suggestions"):
        assert word in out
    # Every suggestion row names the GPU it was judged against and its memory.
    assert "H100-80GB (81559 MiB)" in out
    assert "note: advice for each GPU model registered in the cluster: H100-80GB" in out
    sharded = cli(
        "estimate",
        "--transformer",
        "32,4096,32,50257,2048",
        "--sharding",
        "zero3",
        "--data-parallel",
        "8",
        "--checkpointing",
        "--json",
    )
    assert sharded.exit_code == 0, sharded.output
    body = json.loads(sharded.stdout)
    assert body["sharding"] == "zero3" and body["data_parallel"] == 8
    assert body["fits"]["H100-80GB"]["fits_as_requested"] is True


def test_estimate_describes_a_llama_model_and_names_the_gpu(cli) -> None:  # type: ignore[no-untyped-def]
    llama = cli(
        "estimate",
        "--transformer",
        "32,4096,32,32000,4096",
        "--architecture",
        "llama",
        "--json",
    )
    assert llama.exit_code == 0, llama.output
    assert json.loads(llama.stdout)["parameters"] == 6_738_415_616
    spelled_out = cli(
        "estimate",
        "--transformer",
        "32,4096,32,32000,4096",
        "--ffn-hidden",
        "11008",
        "--gated-ffn",
        "--untied-embeddings",
        "--positions",
        "rotary",
        "--norm",
        "rmsnorm",
        "--no-biases",
        "--data-parallel",
        "8",
        "--pipeline-parallel",
        "2",
        "--gpu-model",
        "A100-40GB",
    )
    assert spelled_out.exit_code == 0, spelled_out.output
    out = spelled_out.output
    assert "6.74B parameters: L=32 h=4096 f=11008" in out
    assert "gated FFN, untied head, rotary positions, RMSNorm, no biases" in out
    assert "A100-40GB (40960 MiB)" in out
    assert "note: pipeline schedule 1f1b" in out
    assert "note: advice for the GPU model named, A100-40GB (40960 MiB)" in out
    gpt2 = cli("estimate", "--transformer", "48,1600,25,50257,1024", "--json")
    assert json.loads(gpt2.stdout)["parameters"] == 1_557_611_200


def test_estimate_errors(cli) -> None:  # type: ignore[no-untyped-def]
    bad = cli("estimate", "--parameters", "7e9", "--precision", "fp8")
    assert bad.exit_code == 1 and "precision" in bad.stderr
    shape = cli("estimate", "--transformer", "32,4096")
    assert shape.exit_code == 2 and "LAYERS,HIDDEN,HEADS,VOCAB,SEQ_LEN" in shape.stderr
    count = cli("estimate", "--parameters", "lots")
    assert count.exit_code == 2 and "--parameters" in count.stderr
    loose = cli("estimate", "--parameters", "7e9", "--gated-ffn", "--ffn-hidden", "11008")
    assert loose.exit_code == 2
    assert "--ffn-hidden, --gated-ffn: describe a --transformer shape" in loose.stderr
    norm = cli("estimate", "--transformer", "2,64,4,100,16", "--norm", "batchnorm")
    assert norm.exit_code == 1 and "norm" in norm.stderr
    gpu = cli("estimate", "--parameters", "7e9", "--gpu-model", "Radeon")
    assert gpu.exit_code == 1 and "unknown GPU model 'Radeon'" in gpu.stderr
