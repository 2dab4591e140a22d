"""The CLI test harness: `gpusched` run in-process (CliRunner) against a live server."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner, Result

from app.cli import app as cli_app
from app.config import Settings
from tests.foundation.builders import add_user


@dataclass
class Cli:
    """Runs `gpusched` in-process against the live server, as one of the test users."""

    url: str
    settings: Settings
    database_url: str
    factory: sessionmaker[Session]
    tokens: dict[str, str] = field(default_factory=dict)
    runner: CliRunner = field(default_factory=CliRunner)

    def env(self, **extra: str | None) -> dict[str, str | None]:
        env: dict[str, str | None] = {
            # Nothing from the developer's shell may leak into a test.
            "GPUSCHED_URL": None,
            "GPUSCHED_TOKEN": None,
            "GPUSCHED_HOST": None,
            "GPUSCHED_PORT": None,
            "GPUSCHED_REDIS_URL": None,
            "GPUSCHED_TOKEN_TTL_DAYS": None,
            "GPUSCHED_DATA_DIR": str(self.settings.data_dir),
            "GPUSCHED_DATABASE_URL": self.database_url,
            # The CLI's token and URL files (~/.config/gpusched): the test's own.
            "XDG_CONFIG_HOME": str(self.settings.data_dir.parent / "xdg-config"),
            "COLUMNS": "200",  # rich tables: no truncated cells
        }
        env.update(extra)
        return env

    def raw(self, args: Sequence[str], **env: str | None) -> Result:
        """`gpusched ARGS` with only the environment (no --url/--token added)."""
        return self.runner.invoke(cli_app, list(args), env=self.env(**env))

    def __call__(self, *args: str, user: str = "alice", **env: str | None) -> Result:
        """`gpusched CMD --url URL --token TOKEN REST...` as `user`."""
        command, rest = args[0], list(args[1:])
        connection = ["--url", self.url, "--token", self.tokens[user]]
        return self.raw([command, *connection, *rest], **env)

    def add_user(self, name: str, projects: list[str], *, admin: bool = False) -> str:
        self.tokens[name] = add_user(self.factory, name, projects, admin=admin)
        return self.tokens[name]
