"""Estimator and report commands: estimate, seff, usage."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import typer

from app.cli.client import (
    EXIT_USAGE,
    ApiClient,
    CliError,
    JsonOption,
    TokenOption,
    UrlOption,
    add_row,
    console,
    format_time,
    human_duration,
    make_table,
    print_json,
)
from app.cli.jobs.options import parse_duration

ESTIMATE = "/api/v1/estimate"
USAGE = "/api/v1/reports/usage"
GIB = 2**30


def parse_count(value: str | None, what: str) -> int | None:
    """'7e9', '7000000000', '7B', '1.5T' or '350M' -> an integer count."""
    if value is None:
        return None
    text = value.strip().replace("_", "").replace(",", "")
    scale = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}.get(text[-1:].lower())
    try:
        number = float(text[:-1] if scale else text) * (scale or 1)
    except ValueError:
        raise CliError(f"{what}: {value!r}: expected a number like 7e9 or 7B", EXIT_USAGE) from None
    if number != number or number in (float("inf"), float("-inf")):
        raise CliError(f"{what}: {value!r}: expected a finite number", EXIT_USAGE)
    return round(number)


def parse_transformer(value: str | None) -> dict[str, int] | None:
    """'L,H,HEADS,VOCAB,SEQ' -> a transformer shape."""
    if value is None:
        return None
    parts = [p.strip() for p in value.split(",")]
    if len(parts) != 5 or not all(p.isdigit() for p in parts):
        raise CliError(
            f"--transformer: {value!r}: expected LAYERS,HIDDEN,HEADS,VOCAB,SEQ_LEN "
            "(e.g. 32,4096,32,50257,2048)",
            EXIT_USAGE,
        )
    layers, hidden, heads, vocab, seq_len = (int(p) for p in parts)
    return {"layers": layers, "hidden": hidden, "heads": heads, "vocab": vocab, "seq_len": seq_len}


def transformer_body(
    transformer: str | None, architecture_options: dict[str, tuple[str, Any]]
) -> dict[str, Any] | None:
    """The request's ``transformer``: the shape and the architecture options given
    (``{flag: (field, value)}``); they describe a shape, so they need ``--transformer``."""
    shape = parse_transformer(transformer)
    given = {flag: pair for flag, pair in architecture_options.items() if pair[1] is not None}
    if shape is None:
        if given:
            raise CliError(
                f"{', '.join(given)}: describe a --transformer shape; give --transformer too",
                EXIT_USAGE,
            )
        return None
    return {**shape, **dict(given.values())}


def _gib(value: float | None) -> str:
    return "" if value is None else f"{value / GIB:.2f} GiB"


def _hours(value: float | None) -> str:
    if value is None:
        return ""
    return human_duration(value * 3600) if value < 24 * 365 else f"{value / 24 / 365:.1f} years"


def _shape_line(shape: dict[str, Any]) -> str:
    ffn = shape["ffn_hidden"] or 4 * shape["hidden"]
    line = (
        f"L={shape['layers']} h={shape['hidden']} f={ffn} heads={shape['heads']} "
        f"V={shape['vocab']} s={shape['seq_len']}"
    )
    traits = [
        "gated FFN" if shape["gated_ffn"] else "",
        "" if shape["tied_embeddings"] else "untied head",
        "rotary positions" if shape["position_embedding"] == "rotary" else "",
        "RMSNorm" if shape["norm"] == "rmsnorm" else "",
        "" if shape["biases"] else "no biases",
    ]
    return ", ".join([line, *(t for t in traits if t)])


def print_estimate(result: dict[str, Any]) -> None:
    out = console()
    out.print(
        f"{result['parameters'] / 1e9:.2f}B parameters"
        f"{' (shape assumed)' if result['shape_assumed'] else ''}: "
        f"{_shape_line(result['shape'])}; "
        f"{result['precision']} {result['optimizer']}, sharding={result['sharding']}, "
        f"{result['gpu_count']} GPU(s) (tp={result['tensor_parallel']} "
        f"pp={result['pipeline_parallel']} dp={result['data_parallel']}), "
        f"global batch {result['global_batch']}",
        soft_wrap=True,
        markup=False,
    )
    breakdown = make_table("COMPONENT", "PER GPU", title="Memory per GPU")
    for key in ("weights", "gradients", "optimizer_states", "activations", "overhead", "total"):
        add_row(breakdown, key, _gib(result["per_gpu_bytes"][key]))
    add_row(breakdown, "request (MiB)", result["per_gpu_mib"])
    out.print(breakdown)
    fits = make_table(
        "GPU MODEL", "MEMORY", "FITS AS ASKED", "MIN GPUS", "TRAINING TIME", "NOTE", title="Fits"
    )
    for fit in result["fits"].values():
        # Time where it runs: as asked if it fits so, else from the smallest fitting count.
        time = fit.get("training_time") if fit["fits_as_requested"] else None
        time = time or fit.get("training_time_at_min")
        add_row(
            fits,
            fit["gpu_model"],
            f"{fit['memory_mb']} MiB",
            "yes" if fit["fits_as_requested"] else "no",
            fit["min_gpu_count"] if fit["min_gpu_count"] is not None else "never",
            f"{_hours(time['hours'])} on {time['gpu_count']} GPUs" if time else "",
            fit["message"],
        )
    out.print(fits)
    if result["suggestions"]:
        table = make_table(
            "ON",
            "CHANGE",
            "GPUS",
            "PER GPU",
            "FITS",
            title="Suggestions (verified, cheapest first)",
        )
        for s in result["suggestions"]:
            target = s["gpu_model"] or "target_gpu_memory_mb"
            change = "\n".join([s["description"], *(f"warning: {w}" for w in s["warnings"])])
            add_row(
                table,
                f"{target} ({s['target_bytes'] // 2**20} MiB)",
                change,
                s["gpu_count"],
                _gib(s["total_bytes"]),
                "yes" if s["fits"] else "no",
            )
        out.print(table)
    for warning in result["warnings"]:
        out.print(f"warning: {warning}", soft_wrap=True, markup=False)
    for note in result["assumptions"]:
        out.print(f"note: {note}", soft_wrap=True, markup=False)


def estimate(
    parameters: Annotated[
        str | None, typer.Option("--parameters", help="Parameter count: 7e9, 7B, 350M")
    ] = None,
    transformer: Annotated[
        str | None,
        typer.Option("--transformer", help="Shape instead of a count: L,HIDDEN,HEADS,VOCAB,SEQ"),
    ] = None,
    architecture: Annotated[
        str | None,
        typer.Option(
            help="Defaults of the shape options below: gpt (GPT-2/3) or llama (gated FFN, "
            "untied head, rotary positions, RMSNorm, no biases)"
        ),
    ] = None,
    ffn_hidden: Annotated[
        int | None, typer.Option("--ffn-hidden", help="MLP inner size (default 4*HIDDEN)")
    ] = None,
    gated_ffn: Annotated[
        bool | None,
        typer.Option("--gated-ffn/--no-gated-ffn", help="Gated feed-forward (SwiGLU)"),
    ] = None,
    tied_embeddings: Annotated[
        bool | None,
        typer.Option(
            "--tied-embeddings/--untied-embeddings",
            help="Output head shares the input embedding",
        ),
    ] = None,
    positions: Annotated[
        str | None, typer.Option("--positions", help="learned or rotary position embeddings")
    ] = None,
    norm: Annotated[str | None, typer.Option(help="layernorm or rmsnorm")] = None,
    biases: Annotated[
        bool | None, typer.Option("--biases/--no-biases", help="Linear layers have biases")
    ] = None,
    seq_len: Annotated[
        int | None, typer.Option("--seq-len", help="Sequence length for --parameters")
    ] = None,
    precision: Annotated[str | None, typer.Option(help="fp32, mixed or bf16")] = None,
    optimizer: Annotated[str | None, typer.Option(help="adam, sgd, adafactor, adam8bit")] = None,
    micro_batch: Annotated[int | None, typer.Option("--micro-batch")] = None,
    gradient_accumulation: Annotated[int | None, typer.Option("--gradient-accumulation")] = None,
    sharding: Annotated[str | None, typer.Option(help="none, zero1, zero2, zero3")] = None,
    data_parallel: Annotated[int | None, typer.Option("--data-parallel")] = None,
    tensor_parallel: Annotated[int | None, typer.Option("--tensor-parallel")] = None,
    pipeline_parallel: Annotated[int | None, typer.Option("--pipeline-parallel")] = None,
    pipeline_schedule: Annotated[
        str | None, typer.Option("--pipeline-schedule", help="1f1b (default) or gpipe")
    ] = None,
    checkpointing: Annotated[
        bool, typer.Option("--checkpointing", help="Full activation recomputation")
    ] = False,
    tokens: Annotated[str | None, typer.Option(help="Token budget: 1e12, 300B")] = None,
    mfu: Annotated[float | None, typer.Option(help="Assumed model FLOP utilisation")] = None,
    gpu_model: Annotated[
        str | None,
        typer.Option(
            "--gpu-model",
            help="GPU model the job would run on (default: the cluster's, else an H100)",
        ),
    ] = None,
    target_memory_mb: Annotated[
        int | None, typer.Option("--target-memory-mb", help="Memory the suggestions aim for")
    ] = None,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Estimate per-GPU training memory, whether it fits the GPU it would run on, how long
    it takes, and verified changes that make it fit."""
    body: dict[str, Any] = {}
    optional = {
        "parameters": parse_count(parameters, "--parameters"),
        "transformer": transformer_body(
            transformer,
            {
                "--architecture": ("architecture", architecture),
                "--ffn-hidden": ("ffn_hidden", ffn_hidden),
                "--gated-ffn": ("gated_ffn", gated_ffn),
                "--tied-embeddings": ("tied_embeddings", tied_embeddings),
                "--positions": ("position_embedding", positions),
                "--norm": ("norm", norm),
                "--biases": ("biases", biases),
            },
        ),
        "seq_len": seq_len,
        "precision": precision,
        "optimizer": optimizer,
        "micro_batch": micro_batch,
        "gradient_accumulation": gradient_accumulation,
        "sharding": sharding,
        "data_parallel": data_parallel,
        "tensor_parallel": tensor_parallel,
        "pipeline_parallel": pipeline_parallel,
        "pipeline_schedule": pipeline_schedule,
        "tokens": parse_count(tokens, "--tokens"),
        "mfu": mfu,
        "gpu_model": gpu_model,
        "target_gpu_memory_mb": target_memory_mb,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if checkpointing:
        body["checkpointing"] = True
    result = ApiClient.from_options(url, token).post(ESTIMATE, json=body)
    if as_json:
        print_json(result)
        return
    print_estimate(result)


def _cpu(report: dict[str, Any]) -> str:
    cpu = report.get("cpu_s")
    if cpu is None:
        return "n/a"
    cores = report.get("cpu_cores_avg")
    text = f"{cpu:.2f}s" if cpu < 60 else human_duration(cpu)
    return text + ("" if cores is None else f" ({cores:.2f} cores on average)")


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}%"


def print_efficiency(report: dict[str, Any]) -> None:
    out = console()
    rows = [
        ("Job", f"{report['job_id']} ({report['name']})"),
        ("User / project", f"{report['user']} / {report['project']}"),
        ("State", report["status"] + (" (live: figures so far)" if report["live"] else "")),
        ("GPUs", report["gpus"]),
        ("GPU-hours", f"{report['gpu_hours']:.2f}"),
        (
            "GPU utilisation",
            f"{_pct(report['avg_util_pct'])} average, {_pct(report['peak_util_pct'])} peak",
        ),
        (
            "GPU memory",
            "n/a"
            if report["peak_memory_mb"] is None
            else f"{report['peak_memory_mb']} MiB peak of {report['memory_requested_mb']} MiB "
            f"{'requested' if report['memory_basis'] == 'requested' else 'on the GPU'} "
            f"({_pct(report['memory_used_pct'])})",
        ),
        ("Energy", f"{report['energy_wh']:.1f} Wh"),
        ("CPU time", _cpu(report)),
        (
            "Host memory",
            "n/a"
            if report.get("host_memory_peak_mb") is None
            else f"{report['host_memory_peak_mb']} MiB peak",
        ),
        ("Idle GPUs", report["idle_gpus"]),
        ("Wasted GPU-hours", f"{report['wasted_gpu_hours']:.2f}"),
    ]
    table = make_table("", "", title="Efficiency")
    for label, value in rows:
        add_row(table, label, value)
    out.print(table)
    if report["per_gpu"]:
        gpus = make_table(
            "GPU",
            "MODEL",
            "HELD",
            "SAMPLES",
            "AVG UTIL",
            "PEAK UTIL",
            "PEAK MEM",
            "ENERGY",
            title="Per GPU",
        )
        for g in report["per_gpu"]:
            add_row(
                gpus,
                f"{g['node']}/gpu{g['gpu_index']}" + (" (idle)" if g["idle"] else ""),
                g["model"],
                human_duration(g["held_s"]),
                g["samples"],
                _pct(g["avg_util_pct"]),
                _pct(g["peak_util_pct"]),
                "" if g["peak_memory_mb"] is None else f"{g['peak_memory_mb']} MiB",
                f"{g['energy_wh']:.1f} Wh",
            )
        out.print(gpus)
    for flag in report["flags"]:
        out.print(f"! {flag['code']}: {flag['message']}", soft_wrap=True, markup=False)
        out.print(f"  advice: {flag['advice']}", soft_wrap=True, markup=False)
    if not report["flags"] and report["samples"]:
        out.print("no efficiency problems found", markup=False)
    for note in report["notes"]:
        out.print(f"note: {note}", soft_wrap=True, markup=False)


def seff(
    job_id: Annotated[int, typer.Argument(help="Job id", show_default=False)],
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Efficiency of one job (like Slurm's seff): utilisation, memory, energy, advice."""
    report = ApiClient.from_options(url, token).get(f"/api/v1/jobs/{job_id}/efficiency")
    if as_json:
        print_json(report)
        return
    print_efficiency(report)


def parse_since(value: str, what: str, now: datetime | None = None) -> str:
    """'7d', '12h', '90m' ago, or an ISO 8601 time (UTC when it has no offset)."""
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        seconds = parse_duration(value, what)
        at = (now or datetime.now(UTC)) - timedelta(seconds=seconds)
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.isoformat()


def usage(
    project: Annotated[
        str | None, typer.Option(help="Project (default: every project you can see)")
    ] = None,
    since: Annotated[
        str, typer.Option(help="Start: a duration ago (7d, 12h) or an ISO 8601 time")
    ] = "7d",
    until: Annotated[
        str | None, typer.Option(help="End: a duration ago or an ISO 8601 time (default: now)")
    ] = None,
    as_csv: Annotated[bool, typer.Option("--csv", help="One CSV row per job on stdout")] = False,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """GPU usage of a project over a period: GPU-hours, jobs by state, utilisation, energy
    and the most wasteful jobs."""
    now = datetime.now(UTC)
    params: dict[str, str] = {"since": parse_since(since, "--since", now)}
    if until is not None:
        params["until"] = parse_since(until, "--until", now)
    if project is not None:
        params["project"] = project
    client = ApiClient.from_options(url, token)
    if as_csv:
        params["format"] = "csv"
        typer.echo(client.request("GET", USAGE, params=params).text, nl=False)
        return
    report = client.get(USAGE, params=params)
    if as_json:
        print_json(report)
        return
    out = console()
    out.print(
        f"{report['project'] or 'all visible projects'}: "
        f"{format_time(report['since'])} .. {format_time(report['until'])}",
        markup=False,
    )
    by_state = ", ".join(f"{k} {v}" for k, v in report["by_state"].items()) or "none"
    out.print(
        f"{report['jobs']} job(s) ({by_state}); {report['gpu_hours']:.2f} GPU-hours, "
        f"{_pct(report['avg_util_pct'])} average utilisation, {report['energy_wh'] / 1000:.2f} "
        f"kWh, {report['wasted_gpu_hours']:.2f} GPU-hours wasted",
        soft_wrap=True,
        markup=False,
    )
    if len(report["projects"]) > 1 or (report["projects"] and report["project"] is None):
        table = make_table(
            "PROJECT", "JOBS", "GPU-HOURS", "AVG UTIL", "ENERGY", "WASTED", title="Per project"
        )
        for p in report["projects"]:
            add_row(
                table,
                p["project"],
                p["jobs"],
                f"{p['gpu_hours']:.2f}",
                _pct(p["avg_util_pct"]),
                f"{p['energy_wh']:.0f} Wh",
                f"{p['wasted_gpu_hours']:.2f}",
            )
        out.print(table)
    if report["top_wasteful"]:
        table = make_table(
            "JOB",
            "NAME",
            "USER",
            "GPU-HOURS",
            "AVG UTIL",
            "WASTED",
            "FLAGS",
            title="Most wasteful jobs",
        )
        for j in report["top_wasteful"]:
            add_row(
                table,
                j["job_id"],
                j["name"],
                j["user"],
                f"{j['gpu_hours']:.2f}",
                _pct(j["avg_util_pct"]),
                f"{j['wasted_gpu_hours']:.2f}",
                " ".join(f["code"] for f in j["flags"]),
            )
        out.print(table)


def register(app: typer.Typer) -> None:
    app.command("estimate", rich_help_panel="Reports")(estimate)
    app.command("seff", rich_help_panel="Reports")(seff)
    app.command("usage", rich_help_panel="Reports")(usage)
