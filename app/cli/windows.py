"""Off-peak window commands: `gpusched window list|create|delete`."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

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

WINDOWS = "/api/v1/windows"
# Openings are looked up this far ahead: a weekly window always has one.
LOOKAHEAD_DAYS = 8
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")

window_app = typer.Typer(
    name="window",
    help="Off-peak windows: local hours when flexible (--offpeak) jobs run.",
    no_args_is_help=True,
)


def _path(name: str) -> str:
    return f"{WINDOWS}/{quote(name, safe='')}"


WindowName = Annotated[str, typer.Argument(help="Window name (a slug)", show_default=False)]


def parse_days(text: str, option: str) -> list[str]:
    """'mon-fri', 'sat,sun', 'fri-mon' (wraps over the week) or 'mon,wed-thu'."""
    days: list[str] = []
    for part in text.split(","):
        first, dash, last = part.strip().lower().partition("-")
        if first not in WEEKDAYS or (dash and last not in WEEKDAYS):
            raise CliError(
                f"{option}: unknown days {text!r}: use mon tue wed thu fri sat sun, as a list"
                " (sat,sun) or a range (mon-fri)",
                EXIT_USAGE,
            )
        start = WEEKDAYS.index(first)
        count = (WEEKDAYS.index(last) - start) % 7 + 1 if dash else 1
        days += [WEEKDAYS[(start + k) % 7] for k in range(count)]
    return list(dict.fromkeys(days))


def parse_daily(value: str) -> dict[str, Any]:
    """'22:00-06:00', optionally followed by days: '22:00-06:00 mon-fri'. The server checks
    the times themselves."""
    hours, _, days = value.strip().partition(" ")
    start, dash, end = hours.partition("-")
    if not dash or not start or not end:
        raise CliError(
            f"--daily {value!r}: expected START-END like 22:00-06:00 (an end before the start"
            " crosses midnight), optionally followed by days: '22:00-06:00 mon-fri'",
            EXIT_USAGE,
        )
    daily: dict[str, Any] = {"start": start, "end": end}
    if days.strip():
        daily["days"] = parse_days(days.strip(), f"--daily {value!r}")
    return daily


def days_text(days: list[str]) -> str:
    """The inverse of `parse_days` for display: runs of three or more days as ranges."""
    runs: list[list[int]] = []
    for i in sorted(WEEKDAYS.index(d) for d in days):
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(
        f"{WEEKDAYS[r[0]]}-{WEEKDAYS[r[-1]]}" if len(r) > 2 else ",".join(WEEKDAYS[i] for i in r)
        for r in runs
    )


def _hours(window: dict[str, Any]) -> str:
    if window.get("cron"):
        return f"cron '{window['cron']}' for {human_duration(window['duration_s'])}"
    ranges = []
    for r in window.get("daily") or []:
        days = f" {days_text(r['days'])}" if r.get("days") else ""
        ranges.append(f"{r['start']}-{r['end']}{days}")
    return "daily " + "; ".join(ranges)


def _opening(opening: dict[str, Any] | None, zone: str) -> str:
    """'2026-11-23 22:00:00 CET - 2026-11-24 06:00:00 CET': in the window's own zone, whose
    hours the HOURS column gives, labelled (UTC under --utc)."""
    if opening is None:
        return f"none in {LOOKAHEAD_DAYS} days"
    opens = format_time(opening["opens_at"], zone=zone)
    return f"{opens} - {format_time(opening['closes_at'], zone=zone)}"


def _next_openings(client: ApiClient) -> dict[str, dict[str, Any]]:
    """The first upcoming (or current) opening of each window."""
    first: dict[str, dict[str, Any]] = {}
    for opening in client.get(f"{WINDOWS}/upcoming", params={"days": LOOKAHEAD_DAYS}):
        first.setdefault(opening["window"], opening)
    return first


def _on_close(window: dict[str, Any]) -> str:
    return "preempt" if window["preempt_on_close"] else "keep running"


@window_app.command("list")
def list_windows(
    as_json: JsonOption = False, url: UrlOption = None, token: TokenOption = None
) -> None:
    """List windows with their hours and next opening."""
    client = ApiClient.from_options(url, token)
    windows = client.get(WINDOWS)
    if as_json:
        print_json(windows)
        return
    if not windows:
        console().print("no off-peak windows: off-peak jobs wait until an admin creates one")
        return
    openings = _next_openings(client)
    table = make_table("NAME", "TIMEZONE", "HOURS", "OUTSIDE", "AT CLOSE", "NEXT OPENING")
    for w in windows:
        add_row(
            table,
            w["name"],
            w["timezone"],
            _hours(w),
            f"{w['capacity_outside_fraction']:.0%}",
            _on_close(w),
            _opening(openings.get(w["name"]), w["timezone"]),
        )
    console().print(table)


@window_app.command("create")
def create(
    name: WindowName,
    tz: Annotated[
        str, typer.Option("--tz", help="IANA time zone of the hours, e.g. Europe/Berlin")
    ],
    daily: Annotated[
        list[str] | None,
        typer.Option(
            help="Local hours START-END, optionally with days: '22:00-06:00 mon-fri' (repeatable)",
            show_default=False,
        ),
    ] = None,
    cron: Annotated[
        str | None,
        typer.Option(help="Cron of local opening times, with --duration", show_default=False),
    ] = None,
    duration: Annotated[
        str | None,
        typer.Option(help="How long a cron window stays open: 8h, 90m", show_default=False),
    ] = None,
    capacity_outside: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Fraction of all GPUs that preemptible off-peak jobs may use while closed",
        ),
    ] = 0.0,
    preempt_on_close: Annotated[
        bool,
        typer.Option(
            "--preempt-on-close/--keep-running",
            help="At closing, stop preemptible off-peak jobs (they are requeued), or let them"
            " finish",
        ),
    ] = True,
    replace: Annotated[
        bool, typer.Option("--replace", help="Replace the window of this name")
    ] = False,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Create an off-peak window (admin): `gpusched window create night --tz Europe/Berlin
    --daily '20:00-07:00 mon-fri' --daily '07:00-20:00 sat,sun'`."""
    if bool(daily) == bool(cron):
        raise CliError("give --daily (repeatable) or --cron with --duration", EXIT_USAGE)
    if cron and duration is None:
        raise CliError("--cron needs --duration: how long each opening lasts", EXIT_USAGE)
    if daily and duration is not None:
        raise CliError("--duration only applies to --cron windows", EXIT_USAGE)
    body = {
        "name": name,
        "timezone": tz,
        "cron": cron,
        "duration_s": None if duration is None else parse_duration(duration, "--duration"),
        "daily": [parse_daily(d) for d in daily] if daily else None,
        "capacity_outside_fraction": capacity_outside,
        "preempt_on_close": preempt_on_close,
    }
    client = ApiClient.from_options(url, token)
    window = client.put(_path(name), json=body) if replace else client.post(WINDOWS, json=body)
    if as_json:
        print_json(window)
        return
    opening = _next_openings(client).get(window["name"])
    typer.echo(
        f"{'replaced' if replace else 'created'} window {window['name']} ({window['timezone']}):"
        f" {_hours(window)}; next opening {_opening(opening, window['timezone'])}"
    )


@window_app.command("delete")
def delete(name: WindowName, url: UrlOption = None, token: TokenOption = None) -> None:
    """Delete a window (admin); refused while pending jobs or batches use it."""
    ApiClient.from_options(url, token).request("DELETE", _path(name))
    typer.echo(f"deleted window {name}")


def register(app: typer.Typer) -> None:
    app.add_typer(window_app, name="window", rich_help_panel="Cluster")
