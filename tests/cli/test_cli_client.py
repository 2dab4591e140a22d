"""Pure helpers: durations, error formatting, default URL."""

from __future__ import annotations

import httpx
import pytest

from app.cli.client import ApiClient, ApiError, CliError, default_url, format_error
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
        json={
            "detail": [
                {"loc": ["body", "gpus"], "msg": "Input should be greater than or equal to 0"},
                {"loc": ["body", "env", "X"], "msg": "bad"},
                {"loc": ["body"], "msg": "Value error, gpu_share below 1 needs gpus = 1"},
                {"loc": ["query", "status", 0], "msg": "Input should be 'PENDING'"},
            ]
        },
    )
    assert format_error(response).splitlines() == [
        "gpus: Input should be greater than or equal to 0",
        "env.X: bad",
        "gpu_share below 1 needs gpus = 1",
        "status: Input should be 'PENDING'",
    ]


def test_format_error_plain_detail_and_non_json() -> None:
    assert format_error(httpx.Response(404, json={"detail": "no job 5"})) == "no job 5"
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
                401, json={"detail": "invalid, expired or revoked token"}
            )
        ),
    )
    with pytest.raises(ApiError) as info:
        client.get("/api/v1/jobs")
    assert info.value.exit_code == 1 and info.value.status_code == 401
    assert info.value.message == "invalid, expired or revoked token"
