import json
import logging

from app.logs import JsonFormatter


def test_json_log_lines_carry_job_context():
    record = logging.LogRecord(
        "gpusched.agent", logging.INFO, __file__, 1, "job %s done", (7,), None
    )
    record.job_id = 7
    record.attempt = 2
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "job 7 done"
    assert (entry["job_id"], entry["attempt"], entry["level"]) == (7, 2, "INFO")
    assert "node" not in entry
