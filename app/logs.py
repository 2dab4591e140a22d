"""Process-wide logging: human text by default, one JSON object per line with
GPUSCHED_LOG_FORMAT=json. Records passed `extra={"job_id": ..., "attempt": ...}` (or node)
carry those as fields, so a job's whole story can be grepped across processes."""

from __future__ import annotations

import json
import logging
import os
import warnings
from datetime import UTC, datetime

CONTEXT_FIELDS = ("job_id", "attempt", "node")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


# GPUSCHED_LOG_LEVEL: how much every process of ours logs (default info). `gpusched up`
# gives its children warning unless asked for more (-v, --log-level): a first start shows
# its URL and token, not Celery's banners and a line per task.
LEVELS = ("debug", "info", "warning", "error")


def log_level_name() -> str:
    """The level GPUSCHED_LOG_LEVEL asks for, lower case; info when unset or unknown."""
    name = os.environ.get("GPUSCHED_LOG_LEVEL", "info").strip().lower()
    return name if name in LEVELS else "info"


def quiet() -> bool:
    """Above info: Celery's startup banner and its root warning stay off the console too."""
    return log_level_name() not in ("debug", "info")


def celery_options() -> list[str]:
    """A Celery worker's `worker_main` argv start: its global --quiet (no banner) when
    quiet, then the worker command; add `--loglevel` from `log_level_name()` after it."""
    if quiet():
        from celery.exceptions import SecurityWarning  # not for every CLI start

        # Its "running the worker with superuser privileges" warning: an agent runs as root
        # by design (jobs run as their owners), and `up` says whose accounts jobs use.
        warnings.filterwarnings("ignore", category=SecurityWarning)
        return ["--quiet", "worker"]
    return ["worker"]


def configure_logging(level: int | None = None) -> None:
    """Root logging, at `level` or else GPUSCHED_LOG_LEVEL's."""
    if level is None:
        level = logging.getLevelName(log_level_name().upper())
        assert isinstance(level, int)
    handler = logging.StreamHandler()
    if os.environ.get("GPUSCHED_LOG_FORMAT", "text").lower() == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # "Task succeeded" lines would double the log (cycles run every few seconds);
    # the "received" line per task stays.
    logging.getLogger("celery.app.trace").setLevel(logging.WARNING)
