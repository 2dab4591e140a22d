"""Pure helpers: durations, error formatting, default URL; where the CLI finds its server
and token."""

from __future__ import annotations

import stat
from pathlib import Path

import httpx
import pytest

from app.cli.client import (
    ApiClient,
    ApiError,
    CliError,
    config_dir,
    default_url,
    format_error,
    resolve_token,
    resolve_url,
    save_client_config,
)
from app.cli.jobs.options import parse_duration
from app.config import Settings


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("3600", 3600), ("90m", 5400), ("2h", 7200), ("1h30m", 5400), ("45s", 45), ("1d2h", 93600),
     ("1H30M", 5400)],
)  # fmt: skip
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "1.5h", "30m1h", "-5", "5q"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(CliError) as info:
        parse_duration(text, "--max-runtime")
    assert info.value.exit_code == 2 and "--max-runtime" in info.value.message


def test_format_error_lists_each_field() -> None:
    response = httpx.Response(
        422,
        headers={"content-type": "application/problem+json"},
        json={
            "type": "about:blank",
            "title": "Unprocessable Content",
            "status": 422,
            "detail": "gpus: Input should be greater than or equal to 0; env.X: bad; ...",
            "instance": "/api/v1/jobs",
            "errors": [
                {"loc": ["body", "gpus"], "msg": "Input should be greater than or equal to 0"},
                {"loc": ["body", "env", "X"], "msg": "bad"},
                {"loc": ["body"], "msg": "Value error, gpu_share below 1 needs gpus = 1"},
                {"loc": ["query", "status", 0], "msg": "Input should be 'PENDING'"},
            ],
        },
    )
    assert format_error(response).splitlines() == [
        "gpus: Input should be greater than or equal to 0",
        "env.X: bad",
        "gpu_share below 1 needs gpus = 1",
        "status: Input should be 'PENDING'",
    ]


def test_format_error_reads_a_list_detail_from_an_older_server() -> None:
    response = httpx.Response(422, json={"detail": [{"loc": ["body", "gpus"], "msg": "bad"}]})
    assert format_error(response) == "gpus: bad"


def test_format_error_plain_detail_and_non_json() -> None:
    problem = {"title": "Not Found", "status": 404, "detail": "no job 5", "instance": "/x"}
    assert format_error(httpx.Response(404, json=problem)) == "no job 5"
    assert format_error(httpx.Response(502, text="Bad Gateway")) == "HTTP 502: Bad Gateway"


def test_default_url_from_settings() -> None:
    assert default_url(Settings(host="0.0.0.0", port=9000)) == "http://127.0.0.1:9000"
    assert default_url(Settings(host="10.0.0.5", port=80)) == "http://10.0.0.5:80"
    assert default_url(Settings(host="::1", port=8000)) == "http://[::1]:8000"


def test_a_non_json_answer_is_a_usage_error_not_a_traceback() -> None:
    client = ApiClient(
        base_url="http://example.invalid",
        token="gps_x",
        transport=httpx.MockTransport(lambda request: httpx.Response(200, text="<html></html>")),
    )
    with pytest.raises(CliError) as info:
        client.get("/api/v1/jobs")
    assert info.value.exit_code == 2 and "not JSON" in info.value.message


def test_error_status_becomes_api_error_with_exit_1() -> None:
    client = ApiClient(
        base_url="http://example.invalid",
        token="gps_x",
        transport=httpx.MockTransport(
            lambda request: httpx.Response(
                401,
                json={
                    "status": 401,
                    "title": "Unauthorized",
                    "detail": "invalid, expired or revoked token",
                },
            )
        ),
    )
    with pytest.raises(ApiError) as info:
        client.get("/api/v1/jobs")
    assert info.value.exit_code == 1 and info.value.status_code == 401
    assert info.value.message == "invalid, expired or revoked token"


# The CLI from any directory (issue 36 point 4): token and URL in $XDG_CONFIG_HOME/gpusched
# (~/.config/gpusched), the data dir's admin token file still read.


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh home and working directory, with no GPUSCHED_* or XDG_CONFIG_HOME set."""
    for name in ("GPUSCHED_URL", "GPUSCHED_TOKEN", "GPUSCHED_HOST", "GPUSCHED_PORT",
                 "GPUSCHED_DATA_DIR", "GPUSCHED_DATABASE_URL", "XDG_CONFIG_HOME"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    work = tmp_path / "somewhere"
    work.mkdir()
    monkeypatch.chdir(work)
    return tmp_path / "home"


def test_the_config_dir_is_xdg_config_home_else_dot_config(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert config_dir() == home / ".config" / "gpusched"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config_dir() == tmp_path / "xdg" / "gpusched"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/ignored")  # as the XDG spec says
    assert config_dir() == home / ".config" / "gpusched"


def test_token_and_url_come_from_the_config_dir_from_any_directory(home: Path) -> None:
    folder = home / ".config" / "gpusched"
    folder.mkdir(parents=True)
    (folder / "token").write_text("gps_from_config\n")
    (folder / "url").write_text("http://10.0.0.5:8000/\n")
    assert resolve_token(None) == "gps_from_config"
    assert resolve_url(None) == "http://10.0.0.5:8000"
    # What is given explicitly wins.
    assert resolve_token("gps_given") == "gps_given"
    assert resolve_url("http://other:1") == "http://other:1"


def test_gpusched_host_or_port_in_the_environment_beat_the_stored_url(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = home / ".config" / "gpusched"
    folder.mkdir(parents=True)
    (folder / "url").write_text("http://10.0.0.5:8000\n")
    monkeypatch.setenv("GPUSCHED_PORT", "9999")
    assert resolve_url(None) == "http://127.0.0.1:9999"


def test_the_data_dirs_admin_token_file_is_still_read(home: Path) -> None:
    Path(".gpusched").mkdir()
    Path(".gpusched/admin.token").write_text("gps_old_place\n")
    assert resolve_token(None) == "gps_old_place"
    assert resolve_url(None) == "http://127.0.0.1:8000"


def test_no_token_anywhere_names_every_place(home: Path) -> None:
    with pytest.raises(CliError) as info:
        resolve_token(None)
    assert info.value.exit_code == 2
    message = info.value.message
    assert "--token" in message and "GPUSCHED_TOKEN" in message
    assert str(home / ".config" / "gpusched" / "token") in message
    assert str(Path.cwd() / ".gpusched" / "admin.token") in message


def test_up_saves_the_url_and_a_new_token_but_keeps_ones_own(home: Path, tmp_path: Path) -> None:
    token_file = tmp_path / "admin.token"
    token_file.write_text("gps_admin\n")
    line = save_client_config(url="http://127.0.0.1:8000", token=None, token_file=token_file)
    folder = home / ".config" / "gpusched"
    assert line.startswith(f"CLI: URL and token saved in {folder}/")
    assert (folder / "token").read_text() == "gps_admin\n"
    assert stat.S_IMODE((folder / "token").stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    # A later start keeps a token of someone's own, and stores the URL it serves on.
    (folder / "token").write_text("gps_mine\n")
    save_client_config(url="http://127.0.0.1:8001", token=None, token_file=token_file)
    assert (folder / "token").read_text() == "gps_mine\n"
    assert (folder / "url").read_text() == "http://127.0.0.1:8001\n"
    # A new admin (a fresh database): its token is the one that works now.
    save_client_config(url="http://127.0.0.1:8001", token="gps_new", token_file=token_file)
    assert (folder / "token").read_text() == "gps_new\n"


def test_a_config_dir_that_cannot_be_written_is_said_not_fatal(home: Path) -> None:
    home.mkdir()
    (home / ".config").write_text("a file, not a folder")
    line = save_client_config(url="http://x", token="gps_t", token_file=home / "none")
    assert line.startswith(f"CLI: could not save the URL and token in {home / '.config'}")
