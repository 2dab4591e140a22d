"""The CLI tests here use the live-server `cli` fixture of tests/cli."""

from tests.cli.conftest import cli  # noqa: F401
