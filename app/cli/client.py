"""The CLI's HTTP client: where the server is, which token to send, and errors as one line.

Every expected failure becomes a `CliError` carrying the message and the exit code
(1: the server rejected the request, 2: usage or connection problem). The Typer group in
`app.cli` turns it into a line on stderr, so no command has to handle it itself.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from typing import Annotated, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import httpx
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from app.config import Settings, SettingsError, load_settings
from app.text import escape_controls

EXIT_REJECTED = 1
EXIT_USAGE = 2

URL_ENV = "GPUSCHED_URL"
TOKEN_ENV = "GPUSCHED_TOKEN"
# The CLI's own files, found from any directory: $XDG_CONFIG_HOME/gpusched (default
# ~/.config/gpusched), as kubectl's ~/.kube/config. `gpusched up` writes them.
TOKEN_FILE = "token"
URL_FILE = "url"


class CliError(Exception):
    """An expected failure: printed as a message to stderr, then exit with `exit_code`."""

    def __init__(self, message: str, exit_code: int = EXIT_REJECTED) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


# How long `gpusched wait` and `logs -f` ride out an API that stopped answering (a
# restart, say) before giving up; the jobs run on regardless. One that never answered
# fails at once.
OUTAGE_RIDE_OUT_S = 600.0


class Unreachable(CliError):
    """No answer from the server at all (refused, timed out): perhaps it is restarting."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE)


class ApiError(CliError):
    """The server answered with an error status."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message, EXIT_REJECTED)
        self.status_code = status_code


# Shared option types: a command module declares `url: UrlOption = None, token: TokenOption = None`
# and calls `ApiClient.from_options(url, token)`.
UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar=URL_ENV,
        show_envvar=True,
        help="gpusched API base URL (default: http://HOST:PORT from GPUSCHED_HOST/"
        "GPUSCHED_PORT, else the url file in ~/.config/gpusched, else http://127.0.0.1:8000)",
        rich_help_panel="Connection",
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar=TOKEN_ENV,
        show_envvar=True,
        help="API token (default: the token file in ~/.config/gpusched, else the admin "
        "token file in the data dir)",
        rich_help_panel="Connection",
    ),
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print the raw API objects as JSON on stdout.")
]


def settings_or_exit() -> Settings:
    """Settings from the environment; an unusable one is a usage error (exit 2)."""
    try:
        return load_settings()
    except SettingsError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None


def default_url(settings: Settings) -> str:
    host = settings.host
    # The server may listen on every interface; a client connects to one of them.
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{settings.port}"


def config_dir() -> Path:
    """$XDG_CONFIG_HOME/gpusched, or ~/.config/gpusched (the XDG base directory spec: a
    relative XDG_CONFIG_HOME is ignored)."""
    base = os.environ.get("XDG_CONFIG_HOME", "")
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".config"
    return root / "gpusched"


def _read_stored(path: Path) -> str:
    """A stored token or URL, stripped; "" when the file is absent."""
    try:
        return path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return ""
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", EXIT_USAGE) from None


def resolve_url(url: str | None) -> str:
    """--url or GPUSCHED_URL; else GPUSCHED_HOST/GPUSCHED_PORT when either is set; else the
    URL stored in the config dir (`gpusched up` saves it); else the default host and port."""
    if url:
        return url.rstrip("/")
    settings = settings_or_exit()
    if not {"GPUSCHED_HOST", "GPUSCHED_PORT"} & os.environ.keys():
        stored = _read_stored(config_dir() / URL_FILE)
        if stored:
            return stored.rstrip("/")
    return default_url(settings)


def resolve_token(token: str | None) -> str:
    """--token or GPUSCHED_TOKEN; else the token file in the config dir (from any
    directory); else, as before, the admin token file in the data dir."""
    if token:
        return token.strip()
    in_config = config_dir() / TOKEN_FILE
    stored = _read_stored(in_config)
    if stored:
        return stored
    in_data_dir = settings_or_exit().admin_token_file
    stored = _read_stored(in_data_dir)
    if not stored:
        raise CliError(
            f"no API token: pass --token, set {TOKEN_ENV}, or save it in {in_config} "
            f"(`gpusched up` does; the admin token file {in_data_dir.absolute()} is read too)",
            EXIT_USAGE,
        )
    return stored


def write_secret(path: Path, content: str) -> None:
    """Write a file only its owner can read (0600), even if it existed with looser bits."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(content)


def save_client_config(*, url: str, token: str | None, token_file: Path) -> str:
    """Where the CLI finds the server and a token from any directory: `url` always (the
    stack just started), the token when it is new, or when none is stored yet, from
    `token_file` (a token of someone's own is kept). Returns the line that says where,
    or why not (a config dir that cannot be written is no reason to stop)."""
    folder = config_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        (folder / URL_FILE).write_text(url + "\n")
        stored = folder / TOKEN_FILE
        if token is None and not _read_stored(stored):
            token = _read_stored(token_file) or None
        if token is not None:
            write_secret(stored, token + "\n")
        elif not _read_stored(stored):
            return f"CLI: server URL saved in {folder / URL_FILE}"
    except (OSError, CliError) as exc:
        why = exc.message if isinstance(exc, CliError) else exc.strerror
        return f"CLI: could not save the URL and token in {folder}: {why}"
    return (
        f"CLI: URL and token saved in {folder}/ (mode 0600): `gpusched` finds them from "
        "any directory"
    )


def format_error(response: httpx.Response) -> str:
    """The server's own message; for a 422 one `field: message` per problem."""
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()
        return f"HTTP {response.status_code}: {text[:500] or response.reason_phrase}"
    # RFC 9457 problem details: `detail` for people, and on a 422 `errors`, one per field.
    # A server before problem details sent the 422's list as `detail` itself.
    detail = body.get("detail") if isinstance(body, dict) else None
    errors = body.get("errors") if isinstance(body, dict) else None
    if errors is None and isinstance(detail, list):
        errors = detail
    if isinstance(errors, list):
        lines = []
        for err in errors:
            if not isinstance(err, dict):
                lines.append(str(err))
                continue
            raw_loc = list(err.get("loc", []))
            where = raw_loc[0] if raw_loc else None
            # "body"/"query"/"path"/"header" say where, not which field; users typed a field.
            if where in ("body", "query", "path", "header"):
                raw_loc = raw_loc[1:]
            if where == "query":
                # A repeated query option (status=A&status=B): the index means nothing here.
                raw_loc = [p for p in raw_loc if not isinstance(p, int)]
            loc = [str(p) for p in raw_loc]
            msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
            lines.append(f"{'.'.join(loc)}: {msg}" if loc else msg)
        return "\n".join(lines) or f"HTTP {response.status_code}"
    if detail is not None:
        return str(detail)
    return f"HTTP {response.status_code}: {response.text.strip()[:500]}"


def _describe_transport_error(exc: httpx.TransportError) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.ConnectError) and "refused" in text.lower():
        return "connection refused"
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out ({type(exc).__name__})"
    return text


@dataclass
class ApiClient:
    base_url: str
    token: str
    timeout: float = 30.0
    transport: httpx.BaseTransport | None = field(default=None, repr=False)

    @classmethod
    def from_options(cls, url: str | None, token: str | None) -> ApiClient:
        return cls(base_url=resolve_url(url), token=resolve_token(token))

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Any = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """Send one request; any error status or transport failure raises a CliError."""
        all_headers = {"Authorization": f"Bearer {self.token}", **(headers or {})}
        try:
            with httpx.Client(
                base_url=self.base_url, timeout=self.timeout, transport=self.transport
            ) as http:
                response = http.request(method, path, json=json, params=params, headers=all_headers)
        except httpx.InvalidURL as exc:
            raise CliError(f"invalid URL {self.base_url!r}: {exc}", EXIT_USAGE) from None
        except httpx.UnsupportedProtocol:
            raise CliError(
                f"invalid URL {self.base_url!r}: expected http:// or https://", EXIT_USAGE
            ) from None
        except httpx.TransportError as exc:
            raise Unreachable(
                f"cannot reach gpusched at {self.base_url}: {_describe_transport_error(exc)}"
                " — is `gpusched server` running?"
            ) from None
        if response.status_code >= 400:
            raise ApiError(format_error(response), response.status_code)
        return response

    def stream_bytes(
        self,
        path: str,
        *,
        params: Any = None,
        on_start: Callable[[httpx.Headers], None] | None = None,
    ) -> Iterator[bytes]:
        """Yield a streamed response's bytes as they arrive (log follow mode), after
        handing its headers to `on_start`. A connection that fails, before or during the
        stream, raises Unreachable."""
        headers = {"Authorization": f"Bearer {self.token}"}
        try:
            with (
                httpx.Client(
                    base_url=self.base_url, timeout=None, transport=self.transport
                ) as http,
                http.stream("GET", path, params=params, headers=headers) as response,
            ):
                if response.status_code >= 400:
                    response.read()
                    raise ApiError(format_error(response), response.status_code)
                if on_start is not None:
                    on_start(response.headers)
                yield from response.iter_bytes()
        except httpx.TransportError as exc:
            raise Unreachable(
                f"cannot reach gpusched at {self.base_url}: {_describe_transport_error(exc)}"
            ) from None

    def body(self, response: httpx.Response) -> Any:
        try:
            return response.json()
        except ValueError:
            raise CliError(
                f"unexpected answer from {self.base_url}{response.request.url.path}: not JSON"
                " — is the URL a gpusched server?",
                EXIT_USAGE,
            ) from None

    def get(self, path: str, *, params: Any = None) -> Any:
        return self.body(self.request("GET", path, params=params))

    def post(
        self,
        path: str,
        *,
        json: Any = None,
        headers: dict[str, str] | None = None,
        params: Any = None,
    ) -> Any:
        return self.body(self.request("POST", path, json=json, headers=headers, params=params))

    def put(self, path: str, *, json: Any) -> Any:
        return self.body(self.request("PUT", path, json=json))

    def patch(self, path: str, *, json: Any, params: Any = None) -> Any:
        return self.body(self.request("PATCH", path, json=json, params=params))


# --- output helpers shared by the command modules -------------------------------------------


def print_json(obj: Any) -> None:
    """Machine-readable output: the API objects as the server sent them."""
    typer.echo(json.dumps(obj, indent=2, ensure_ascii=False))


# Wide enough that no table cell is ever cut in a pipe.
PIPE_WIDTH = 1000


def console() -> Console:
    # Built per call: CliRunner (and pipes) swap sys.stdout between invocations.
    out = Console(highlight=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        # Rich assumes 80 columns off a terminal; `gpusched jobs | grep` must see whole
        # reasons, as `ps aux | grep` sees whole command lines.
        out.width = PIPE_WIDTH
    return out


def make_table(*columns: str, title: str | None = None) -> Table:
    table = Table(*columns, title=title, title_justify="left", expand=False)
    return table


def add_row(table: Table, *values: object) -> None:
    # Text(), not str: a job named "[red]x" must print as typed, not as rich markup; and
    # control characters written out, lest a name retitle or clear the reader's terminal.
    # A cell's own line breaks (one variable a line) stay.
    table.add_row(*(Text(_cell(v)) for v in values))


def _cell(value: object) -> str:
    if value is None:
        return ""
    return "\n".join(escape_controls(line) for line in str(value).split("\n"))


# `gpusched --utc`: every time printed in UTC instead of local time (set by the root
# callback on each invocation, so one run's choice never leaks into the next).
_utc_output = False


def set_utc_output(utc: bool) -> None:
    global _utc_output
    _utc_output = utc


def format_time(value: str | datetime | None, *, zone: str | None = None) -> str:
    """The one way the CLI prints a time: to the second with its zone, as
    `2026-11-27 14:05:09 CET`; in local time (TZ), or in the IANA `zone` given (a window's
    or a batch's own), or in UTC under `gpusched --utc`. '' when absent; a value that is not
    a time is printed as it came. --json keeps the API's ISO 8601 with offset."""
    at = value if isinstance(value, datetime) else parse_time(value)
    if at is None:
        return "" if value is None else str(value)
    if _utc_output:
        return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    tz = None
    if zone:
        try:
            tz = ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            tz = None
    return at.astimezone(tz).strftime("%Y-%m-%d %H:%M:%S %Z")


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


# sbatch --begin's other forms: now[+COUNT[UNIT]] (seconds by default) and HH:MM[:SS].
_RELATIVE = re.compile(r"now(?:\+(\d+)(seconds?|minutes?|hours?|days?|weeks?|[smhdw])?)?")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_at(value: str, now: datetime | None = None) -> datetime:
    """An ISO 8601 time (without a UTC offset, local time), or as sbatch --begin also
    writes it: now+2hours (now+N: seconds), or HH:MM[:SS] (its next occurrence)."""
    now = now or datetime.now().astimezone()
    text = value.strip().lower()
    if relative := _RELATIVE.fullmatch(text):
        count, unit = relative.groups()
        return now + timedelta(seconds=int(count or 0) * _UNIT_S[(unit or "s")[0]])
    try:
        clock = time.fromisoformat(text) if text.count(":") in (1, 2) and len(text) <= 8 else None
        at = datetime.fromisoformat(value) if clock is None else None
    except ValueError:
        raise CliError(
            f"--at: {value!r}: expected an ISO 8601 time (2026-11-23T02:00:00+01:00), "
            "now+COUNT[seconds|minutes|hours|days|weeks], or HH:MM[:SS]",
            EXIT_USAGE,
        ) from None
    if at is not None:
        return at if at.tzinfo else at.astimezone()
    assert clock is not None
    today = now.replace(hour=clock.hour, minute=clock.minute, second=clock.second, microsecond=0)
    return today if today > now else today + timedelta(days=1)


def count_or_none(value: str, option: str, *, none_word: str = "none") -> int | None:
    """A count an option gives (`--max-pending 500`), or None for `none_word`."""
    if value.strip().lower() == none_word:
        return None
    try:
        count = int(value.replace(",", "").replace("_", ""))
    except ValueError:
        count = -1
    if count < 0:
        raise CliError(f"{option}: expected a count (0 or more) or {none_word}, got {value!r}",
                       EXIT_USAGE)  # fmt: skip
    return count


def human_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        hours, rest = divmod(seconds, 3600)
        return f"{hours}h{rest // 60}m" if rest >= 60 else f"{hours}h"
    days, rest = divmod(seconds, 86400)
    return f"{days}d{rest // 3600}h" if rest >= 3600 else f"{days}d"


def age(value: str | None, now: datetime | None = None) -> str:
    """'5m' for an ISO timestamp five minutes ago; '' when absent."""
    at = parse_time(value)
    if at is None:
        return ""
    return human_duration(((now or datetime.now(UTC)) - at).total_seconds())
