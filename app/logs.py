"""Process-wide logging: human text by default, one JSON object per line with
GPUSCHED_LOG_FORMAT=json. Records passed `extra={"job_id": ..., "attempt": ...}` (or node)
carry those as fields, so a job's whole story can be grepped across processes."""

from __future__ import annotations

import json
import logging
import os
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


def configure_logging(level: int = logging.INFO) -> None:
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
