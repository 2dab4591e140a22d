"""`gpusched simulate`: replay a cluster trace through the live scheduler's policy code."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from app.cli.client import EXIT_USAGE, CliError
from app.cli.jobs.options import parse_duration
from app.simulator.energy import DEFAULT_GPU_WATTS
from app.simulator.engine import DEFAULT_PREEMPTION_COST_S


def simulate(
    trace: Annotated[Path, typer.Option(help="CSV trace (job_id,user,vc,jobname,gpu_num,...)")],
    nodes: Annotated[int, typer.Option(help="Simulated nodes", min=1)],
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node", min=1)],
    policy: Annotated[
        str, typer.Option(help="default, fifo, priority, fair-share, sjf, las, or all")
    ] = "default",
    time_scale: Annotated[
        float, typer.Option(help="Divide inter-arrival times by K to raise the load", min=0.001)
    ] = 1.0,
    json_: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False,
    windows: Annotated[
        Path | None,
        typer.Option(help="JSON list of off-peak windows, each a POST /windows body"),
    ] = None,
    tariff: Annotated[
        Path | None,
        typer.Option(help="Time-of-use tariff JSON (the GPUSCHED_TARIFF_FILE format)"),
    ] = None,
    offpeak_fraction: Annotated[
        float,
        typer.Option(help="Share of trace jobs (seeded draw) submitted off-peak", min=0, max=1),
    ] = 0.0,
    gpu_watts: Annotated[
        float,
        typer.Option(help="Power of one busy GPU, for energy (700: H100 SXM limit)", min=0),
    ] = DEFAULT_GPU_WATTS,
    seed: Annotated[
        int, typer.Option(help="Seed for the off-peak and preemptible draws and tie-breaks")
    ] = 0,
    start: Annotated[
        str | None,
        typer.Option(help="Instant of trace time 0, ISO 8601 with offset (default 2026-01-01Z)"),
    ] = None,
    starvation_after: Annotated[
        str,
        typer.Option(help="Default policy: a job waiting this long goes first (0 = never)"),
    ] = "0",
    exact_runtimes: Annotated[
        bool,
        typer.Option(
            "--exact-runtimes",
            help="Tell the scheduler each job's true duration (what perfect estimates would gain)",
        ),
    ] = False,
    preemption_cost: Annotated[
        str,
        typer.Option(
            help="Work each preemption adds to its job: restart + work since its checkpoint"
        ),
    ] = f"{DEFAULT_PREEMPTION_COST_S:g}",
    preemptible_fraction: Annotated[
        float,
        typer.Option(
            help="Share of trace jobs (seeded draw) that may be preempted; the rest never",
            min=0,
            max=1,
        ),
    ] = 1.0,
) -> None:
    """Discrete-event simulation of a trace: JCT, queueing, makespan, utilisation, bounds."""
    from app.simulator.cli import run_simulation_cli
    from app.simulator.trace import TraceError

    starvation_after_s = parse_duration(starvation_after, "--starvation-after")
    preemption_cost_s = parse_duration(preemption_cost, "--preemption-cost")
    if not trace.is_file():
        raise CliError(f"no trace file at {trace}", EXIT_USAGE)
    try:
        output = run_simulation_cli(
            trace,
            nodes,
            gpus_per_node,
            None if policy == "all" else policy,
            time_scale,
            json_,
            windows_file=windows,
            tariff_file=tariff,
            offpeak_fraction=offpeak_fraction,
            gpu_watts=gpu_watts,
            seed=seed,
            start=start,
            starvation_after_s=starvation_after_s,
            exact_runtimes=exact_runtimes,
            preemption_cost_s=preemption_cost_s,
            preemptible_fraction=preemptible_fraction,
        )
    except TraceError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None  # it names the file, line and field
    except (ValueError, KeyError) as exc:
        raise CliError(f"cannot simulate {trace}: {exc}", EXIT_USAGE) from None
    for note in output.notes:
        typer.echo(note, err=True)
    typer.echo(output.text)


def register(app: typer.Typer) -> None:
    app.command("simulate", rich_help_panel="Scheduling")(simulate)
