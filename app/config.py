"""Service settings: one pydantic-settings object, read from GPUSCHED_* variables.

The object is built once at the edge (CLI, app factory, worker) and passed in;
nothing deeper imports a global instance.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class SettingsError(RuntimeError):
    """An unusable setting; the message names the variable and the reason."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUSCHED_", extra="ignore")

    data_dir: Path = Path(".gpusched")
    database_url: str = ""
    redis_url: str = ""
    redis_password_file: Path | None = Field(
        default=None,
        description="a file holding Redis's password (a Docker secret): put into redis_url, "
        "so that the password is in no process's environment",
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    token_ttl_days: int = Field(default=0, ge=0, description="0 = tokens never expire")
    token_cache_s: float = Field(
        default=5.0, ge=0, description="how long a verified token is trusted without a DB read"
    )
    auth_failures_per_minute: int = Field(
        default=60,
        ge=1,
        description="failed token checks per client address (and per token prefix) before "
        "429; a valid token is never refused",
    )
    trusted_proxies: str = Field(
        default="",
        description="addresses or networks (CIDR) of the reverse proxies whose "
        "X-Forwarded-For names the client, comma-separated; empty: the header is ignored",
    )
    max_body_bytes: int = Field(default=1_000_000, ge=1024)
    log_cap_bytes: int = Field(default=10_000_000, ge=1024)
    heartbeat_timeout_s: float = Field(default=30.0, gt=0)
    default_max_runtime_s: int | None = Field(
        default=None, ge=1, description="time limit of jobs that set none (Slurm's DefaultTime)"
    )
    max_runtime_limit_s: int | None = Field(
        default=None, ge=1, description="longest time limit a job may ask for (Slurm's MaxTime)"
    )
    max_grace_s: int = Field(
        default=600,
        ge=0,
        le=86400,
        description="longest SIGTERM-to-SIGKILL grace period a job may ask for (grace_s)",
    )
    max_pending_jobs_per_user: int = Field(
        default=10_000,
        ge=1,
        description="jobs (array tasks each) a user may have pending, unless an admin set "
        "the user's own limit (Slurm's MaxSubmitJobs)",
    )
    notify_hosts: str = Field(
        default="",
        description="hosts a job's notify_url may name, comma-separated (* for any); "
        "empty: notifications are off",
    )
    retention_days: int | None = Field(
        default=None,
        ge=30,
        le=36500,
        description="delete jobs that ended, audit events and batch firings older than "
        "this many days (slurmdbd's PurgeJobAfter); unset: keep everything",
    )
    tariff_file: Path | None = Field(
        default=None, description="JSON time-of-use tariff: prices energy in the reports"
    )

    @field_validator("max_runtime_limit_s")
    @classmethod
    def _limit_covers_default(cls, value: int | None, info: ValidationInfo) -> int | None:
        default = info.data.get("default_max_runtime_s")
        if value is not None and default is not None and default > value:
            raise ValueError(f"below GPUSCHED_DEFAULT_MAX_RUNTIME_S ({default})")
        return value

    @property
    def notify_host_set(self) -> frozenset[str]:
        return frozenset(h.strip().lower() for h in self.notify_hosts.split(",") if h.strip())

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies_are_addresses(cls, value: str) -> str:
        for entry in _split(value):
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address or network") from None
        return value

    @property
    def trusted_proxy_list(self) -> list[str]:
        return _split(self.trusted_proxies)

    @field_validator("database_url")
    @classmethod
    def _database_url_parses(cls, value: str) -> str:
        if value:
            # Imported here: SQLAlchemy costs a quarter of a second to load, and the
            # command line reads these settings in every command, most of them clients
            # of the API that never open a database.
            from sqlalchemy.engine import make_url
            from sqlalchemy.exc import ArgumentError

            try:
                url = make_url(value)
            except ArgumentError as exc:
                raise ValueError(f"not a database URL: {exc}") from exc
            if url.get_backend_name() not in {"sqlite", "postgresql"}:
                raise ValueError("only sqlite:// and postgresql:// URLs are supported")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url_scheme(cls, value: str) -> str:
        if value and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value

    @field_validator("redis_password_file")
    @classmethod
    def _password_readable(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is not None:
            _read_password(value)
            if urlsplit(info.data.get("redis_url") or "redis:").scheme not in ("redis", "rediss"):
                raise ValueError("needs a redis:// or rediss:// GPUSCHED_REDIS_URL")
        return value

    @model_validator(mode="after")
    def _password_in_redis_url(self) -> Settings:
        if self.redis_password_file is not None and self.redis_url:
            parts = urlsplit(self.redis_url)
            user = quote(parts.username or "", safe="")
            password = quote(_read_password(self.redis_password_file), safe="")
            host = parts.netloc.rpartition("@")[2]
            self.redis_url = urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))
        return self

    @property
    def effective_database_url(self) -> str:
        """The configured URL, or a SQLite file in the data dir (the laptop default)."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'gpusched.db').resolve()}"

    @property
    def admin_token_file(self) -> Path:
        return self.data_dir / "admin.token"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"


def _read_password(path: Path) -> str:
    try:
        password = path.read_text().strip()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    if not password:
        raise ValueError(f"{path} is empty")
    return password


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def load_settings(**overrides: object) -> Settings:
    """Build settings from the environment, turning validation errors into one clear message."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = "; ".join(
            f"GPUSCHED_{'_'.join(str(p) for p in err['loc']).upper()}: {err['msg']}"
            for err in exc.errors()
        )
        raise SettingsError(f"unusable setting: {problems}") from exc
