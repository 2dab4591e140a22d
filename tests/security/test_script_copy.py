"""A job script runs as it was at submission (sbatch's copy): through the real API, the
scheduler's run_job message and a real Agent; the copy is private to the job and gone
once it ends."""

from __future__ import annotations

from pathlib import Path

from tests.security.conftest import Cluster, running_job
from tests.security.test_no_shell_injection import run_through_agent

SCRIPT = '#!/bin/sh\necho "copy: $0 $*"\nls -ld "$(dirname "$0")" "$0"\n'


def test_a_job_runs_its_script_as_submitted(cluster: Cluster, tmp_path: Path) -> None:
    on_disk = tmp_path / "train.sh"
    on_disk.write_text("#!/bin/sh\necho edited since\n")  # what the file says at start
    body = {"command": ["./train.sh", "--lr", "0.1"], "script": SCRIPT, "workdir": str(tmp_path)}
    job_id = running_job(cluster.api, body=body, gpu=1)
    shown = cluster.api.client.get(f"/api/v1/jobs/{job_id}", headers=cluster.headers("alice"))
    assert shown.json()["script_bytes"] == len(SCRIPT)
    get = cluster.api.client.get
    copy = get(f"/api/v1/jobs/{job_id}/script", headers=cluster.headers("alice"))
    assert copy.status_code == 200 and copy.text == SCRIPT
    assert copy.headers["content-type"].startswith("text/plain")
    # Its project's business only, as its logs; a job without a copy says what it runs.
    assert get(f"/api/v1/jobs/{job_id}/script", headers=cluster.headers("bob")).status_code == 403
    plain = running_job(cluster.api, body={"command": ["true"]}, gpu=2)
    other = get(f"/api/v1/jobs/{plain}/script", headers=cluster.headers("alice"))
    assert other.status_code == 404 and "runs its command as it is" in other.text

    finished, log = run_through_agent(cluster, job_id, tmp_path)

    assert finished.result == "SUCCEEDED", (finished, log)
    assert "edited since" not in log
    first, directory, copy = log.splitlines()
    assert first.startswith("copy: /") and first.endswith("/train.sh --lr 0.1"), log
    # Owner only: no other user of the node reads or swaps the script a job runs.
    assert directory.startswith("drwx------") and copy.startswith("-rwx------"), log
    assert not Path(first.split()[1]).parent.exists()  # removed with the attempt


def test_a_script_needs_an_argv_command_and_fits_the_limit(cluster: Cluster) -> None:
    post = cluster.api.client.post
    headers = cluster.headers("alice")
    shell = post("/api/v1/jobs", json={"command": "x", "script": SCRIPT}, headers=headers)
    assert shell.status_code == 422
    assert "script" in shell.text and "needs the command as an argv list" in shell.text
    big = post("/api/v1/jobs", json={"command": ["x"], "script": "#" * 600_000}, headers=headers)
    assert big.status_code == 422 and "script" in big.text
    assert "at most 524288 characters" in big.text  # the limit, not an unknown field
