"""gpusched window list|create|delete against the real API."""

from __future__ import annotations

import json

import pytest

from app.cli.client import CliError
from app.cli.windows import days_text, parse_daily, parse_days
from tests.cli.harness import Cli, Result


def window(cli: Cli, sub: str, *args: str, user: str = "alice") -> Result:
    return cli.raw(["window", sub, "--url", cli.url, "--token", cli.tokens[user], *args])


@pytest.mark.parametrize(
    ("text", "days"),
    [
        ("mon-fri", ["mon", "tue", "wed", "thu", "fri"]),
        ("sat,sun", ["sat", "sun"]),
        ("fri-mon", ["fri", "sat", "sun", "mon"]),  # wraps over the week
        ("Mon,wed-thu,mon", ["mon", "wed", "thu"]),  # case-insensitive, each day once
    ],
)
def test_days(text: str, days: list[str]) -> None:
    assert parse_days(text, "--daily") == days


@pytest.mark.parametrize(
    ("days", "text"),
    [
        (["mon", "tue", "wed", "thu", "fri"], "mon-fri"),
        (["sat", "sun"], "sat,sun"),
        (["mon", "tue", "thu", "fri", "sat", "sun"], "mon,tue,thu-sun"),
    ],
)
def test_days_text(days: list[str], text: str) -> None:
    assert days_text(days) == text


@pytest.mark.parametrize("text", ["22:00", "22:00-", "-06:00", "22:00-06:00 weekdays"])
def test_bad_daily_ranges_say_the_format(text: str) -> None:
    with pytest.raises(CliError) as error:
        parse_daily(text)
    assert error.value.exit_code == 2 and repr(text) in str(error.value)


def test_create_list_replace_and_delete(cli: Cli) -> None:
    result = window(
        cli, "create", "night", "--tz", "Europe/Berlin",
        "--daily", "22:00-06:00 mon-fri", "--daily", "08:00-20:00 sat,sun",
        "--capacity-outside", "0.25", user="admin",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(
        "created window night (Europe/Berlin): daily 22:00-06:00 mon-fri; 08:00-20:00 sat,sun;"
        " next opening "
    )
    [stored] = json.loads(window(cli, "list", "--json").stdout)
    assert stored["daily"] == [
        {"start": "22:00", "end": "06:00", "days": ["mon", "tue", "wed", "thu", "fri"]},
        {"start": "08:00", "end": "20:00", "days": ["sat", "sun"]},
    ]
    assert (stored["capacity_outside_fraction"], stored["preempt_on_close"]) == (0.25, True)

    listed = window(cli, "list")  # any user may read windows
    assert listed.exit_code == 0, listed.stderr
    for text in ("night", "Europe/Berlin", "25%", "preempt"):
        assert text in listed.stdout

    replaced = window(
        cli, "create", "night", "--tz", "UTC", "--cron", "0 1 * * *", "--duration", "4h",
        "--keep-running", "--replace", user="admin",
    )  # fmt: skip
    assert replaced.exit_code == 0, replaced.stderr
    assert "replaced window night (UTC): cron '0 1 * * *' for 4h" in replaced.stdout
    assert "keep running" in window(cli, "list").stdout

    taken = window(cli, "create", "night", "--tz", "UTC", "--daily", "01:00-02:00", user="admin")
    assert taken.exit_code == 1 and "already exists" in taken.stderr

    deleted = window(cli, "delete", "night", user="admin")
    assert deleted.exit_code == 0 and deleted.stdout.strip() == "deleted window night"
    assert "no off-peak windows" in window(cli, "list").stdout


def test_mistakes_are_refused_with_the_option_named(cli: Cli) -> None:
    for args, code, words in (
        (["--daily", "22:00-06:00", "--cron", "0 1 * * *"], 2, "give --daily"),
        ([], 2, "give --daily"),
        (["--cron", "0 1 * * *"], 2, "--cron needs --duration"),
        (["--daily", "22:00-06:00", "--duration", "1h"], 2, "--duration only applies"),
        (["--cron", "0 1 * * *", "--duration", "soon"], 2, "--duration: 'soon'"),
        (["--daily", "22:00-06:00 someday"], 2, "unknown days 'someday'"),
        (["--daily", "25:00-06:00"], 1, "daily.0.start"),
        (["--daily", "22:00-06:00", "--tz", "Mars/Olympus"], 1, "timezone"),
    ):
        tz = [] if "--tz" in args else ["--tz", "UTC"]
        result = window(cli, "create", "w", *tz, *args, user="admin")
        assert result.exit_code == code and words in result.stderr, (args, result.stderr)
    denied = window(cli, "create", "w", "--tz", "UTC", "--daily", "22:00-06:00")
    assert denied.exit_code == 1 and "admin role required" in denied.stderr
    missing = window(cli, "delete", "nope", user="admin")
    assert missing.exit_code == 1 and "no off-peak window named 'nope'" in missing.stderr
