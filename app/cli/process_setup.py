"""What every service command does first: read the settings, make its files its own and
create the data dir. Light on purpose: the agent and scheduler commands import it, and
`app.cli.server` would bring the API's models and migrations into every node's agent."""

from __future__ import annotations

import os
from pathlib import Path

from app.cli.client import EXIT_USAGE, CliError
from app.config import Settings, SettingsError, load_settings


def load_settings_or_exit(**overrides: object) -> Settings:
    from app.windows.tariff import tariff_setting

    try:
        settings = load_settings(**overrides)
        tariff_setting(settings)  # an unusable tariff file stops the command here
        return settings
    except SettingsError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None


def private_files() -> None:
    """Files the service creates (the database, logs, Redis's) are its own alone (umask
    077); the few that others must read are opened up on purpose."""
    os.umask(0o077)


def ensure_data_dir(path: Path) -> None:
    """The data dir holds the admin token and (by default) the database: owner-only."""
    if path.is_dir():
        return
    try:
        path.mkdir(parents=True, mode=0o700)
        os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask
    except OSError as exc:
        raise CliError(f"cannot create data dir {path}: {exc.strerror}", EXIT_USAGE) from None
