"""How many jobs a user, and a project, may have pending (Slurm's MaxSubmitJobs and
GrpSubmitJobs): over the limit a submission is refused whole with a 429 that gives the
limit and the count; an array counts as its tasks; an admin sets the limits (API, CLI),
audited. Real API, both database backends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select, true, update

from app.auth.models import User
from app.config import Settings
from app.db import utcnow
from app.jobs.models import Job
from app.jobs.pending_limits import PendingCounts
from app.jobs.states import JobStatus
from app.projects.models import Project
from tests.cycle.jobs_api import run_one_cycle, statements_while
from tests.foundation.builders import insert_jobs, ready_node

JOBS = "/api/v1/jobs"


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    # A small cluster default, so that the test need not submit 10,000 jobs.
    return Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        token_cache_s=0,
        max_pending_jobs_per_user=5,
    )


def _submit(api: Any, user: str = "alice", **body: Any) -> Any:
    return api.client.post(JOBS, json={"command": ["train"], **body}, headers=api.as_(user))


def _pending(api: Any, user: str) -> int:
    r = api.client.get(JOBS, params={"status": "PENDING", "limit": 100}, headers=api.as_(user))
    assert r.status_code == 200, r.text
    return len(r.json()["items"])


def _admin_patch(api: Any, path: str, body: dict[str, Any]) -> Any:
    r = api.client.patch(path, json=body, headers=api.as_("admin"))
    assert r.status_code == 200, r.text
    return r.json()


def test_a_user_over_the_default_limit_gets_429_with_the_limit_and_the_count(api: Any) -> None:
    assert _submit(api, array={"indices": "0-3"}).status_code == 201  # 4 tasks
    assert _submit(api).status_code == 201  # 5: the limit
    refused = _submit(api)
    assert refused.status_code == 429, refused.text
    detail = refused.json()["detail"]
    assert detail.startswith("user alice may have at most 5 jobs pending and has 5")
    assert "gpusched admin limits alice --max-pending N" in detail
    # Another user is not held back by alice's queue.
    assert _submit(api, user="bob").status_code == 201
    assert _pending(api, "alice") == 5


def test_an_array_counts_as_its_tasks_and_is_refused_whole(api: Any) -> None:
    assert _submit(api, array={"indices": "0-2"}).status_code == 201
    refused = _submit(api, array={"indices": "0-2"})
    assert refused.status_code == 429
    assert "this submission of 3 jobs would pass that" in refused.json()["detail"]
    assert _pending(api, "alice") == 3  # none of the refused array's tasks was kept
    assert _submit(api, array={"indices": "0-1"}).status_code == 201


def test_an_admin_raises_a_users_limit_and_sets_it_back_to_the_default(api: Any) -> None:
    for _ in range(5):
        assert _submit(api).status_code == 201
    assert _submit(api).status_code == 429
    user = _admin_patch(api, "/api/v1/users/alice", {"max_pending_jobs": 7})
    assert user["max_pending_jobs"] == 7
    assert _submit(api, array={"indices": "0-1"}).status_code == 201
    assert _submit(api).status_code == 429
    assert _admin_patch(api, "/api/v1/users/alice", {"max_pending_jobs": None}) == {
        **user,
        "max_pending_jobs": None,
    }
    assert _submit(api).status_code == 429  # 7 pending, the default is 5 again
    events = api.client.get("/api/v1/audit", headers=api.as_("admin")).json()["items"]
    assert any(e["action"] == "user.limits" and e["target"] == "alice" for e in events)
    # Only an admin sets limits.
    own = api.client.patch(
        "/api/v1/users/alice", json={"max_pending_jobs": 100}, headers=api.as_("alice")
    )
    assert own.status_code == 403


def test_a_project_limit_counts_all_its_users_jobs(api: Any) -> None:
    api.add_user("carol", ["ml"])
    queue = _admin_patch(api, "/api/v1/projects/ml", {"max_pending_jobs": 3})
    assert queue["max_pending_jobs"] == 3
    assert _submit(api, array={"indices": "0-1"}).status_code == 201
    assert _submit(api, user="carol").status_code == 201
    refused = _submit(api, user="carol")
    assert refused.status_code == 429
    assert refused.json()["detail"].startswith(
        "project ml may have at most 3 jobs pending and has 3"
    )
    assert "gpusched quota ml --max-pending N" in refused.json()["detail"]
    assert _submit(api, user="bob").status_code == 201  # project cv has no limit
    assert (
        _admin_patch(api, "/api/v1/projects/ml", {"max_pending_jobs": None})["max_pending_jobs"]
        is None
    )
    assert _submit(api, user="carol").status_code == 201


def test_a_job_that_starts_makes_room(api: Any) -> None:
    with api.factory.begin() as session:
        session.add(ready_node("n1", gpus=2, now=utcnow()))
    for _ in range(5):
        assert _submit(api, gpus=1).status_code == 201
    assert _submit(api, gpus=1).status_code == 429
    run_one_cycle(api)  # two of them start: two places free
    assert _pending(api, "alice") == 3
    assert _submit(api, array={"indices": "0-1"}, gpus=1).status_code == 201


def _ids(api: Any, user: str, project: str) -> tuple[int, int]:
    with api.factory() as session:
        return session.execute(
            select(User.id, Project.id).join_from(User, Project, true())
            .where(User.name == user, Project.name == project)
        ).one()  # fmt: skip


def test_a_kept_count_adds_what_any_process_submitted_since_without_counting_the_queue(
    api: Any,
) -> None:
    """An API process counts a user's pending jobs whole once per `ttl_s`; in between it
    reads only the jobs with a higher id than it had seen, so a user with a deep queue does
    not have it counted at each submission, and jobs another process added are not
    missed."""
    user_id, project_id = _ids(api, "alice", "ml")
    insert_jobs(api.factory, user="alice", project="ml", count=4)
    running = insert_jobs(
        api.factory, user="alice", project="ml", count=1, status=JobStatus.RUNNING
    )
    counts = PendingCounts(ttl_s=3600)
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement.lower())

    def pending() -> tuple[int, int | None]:
        with api.factory() as session:
            return counts.pending(
                session, user_id=user_id, project_id=project_id, project=True, below_id=10**9
            )

    assert pending() == (4, 4)
    started = insert_jobs(api.factory, user="alice", project="ml", count=3)  # another process
    insert_jobs(api.factory, user="bob", project="cv", count=2)  # neither alice's nor ml's
    with api.factory.begin() as session:  # one of them started already
        session.execute(update(Job).where(Job.id == started[0]).values(status=JobStatus.RUNNING))
    engine = api.factory.kw["bind"]
    event.listen(engine, "before_cursor_execute", seen)
    try:
        assert pending() == (6, 6)
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    # One read, bounded by the primary key: no count of the user's queue.
    reads = [s for s in statements if s.startswith("select")]  # SQLite also says BEGIN
    assert len(reads) == 1 and "count(" not in reads[0], reads

    # A job put back in line has an older id: it is counted at the next whole count.
    with api.factory.begin() as session:
        session.execute(update(Job).where(Job.id == running[0]).values(status=JobStatus.PENDING))
    assert pending() == (6, 6)
    counts.ttl_s = 0
    assert pending() == (7, 7)


def _job_reads(api: Any, submit: Any) -> list[str]:
    """The statements `submit()` sent that read the job table."""
    return [
        s
        for s in statements_while(api, submit)
        if s.lower().startswith("select") and " job" in s.lower()
    ]


def test_a_submission_with_room_under_its_limits_counts_nothing(api: Any) -> None:
    """Between whole counts, a submission whose jobs, with every id handed out since the
    count, would still be within the limits reads nothing of the queue; near the limit it
    counts exactly, so other users' jobs do not make it refuse."""
    _admin_patch(api, "/api/v1/users/alice", {"max_pending_jobs": 100})
    assert _submit(api).status_code == 201  # counts whole, and keeps the count

    def ok() -> None:
        assert _submit(api).status_code == 201

    assert _job_reads(api, ok) == []
    insert_jobs(api.factory, user="bob", project="cv", count=120)  # ids alice's bound counts
    reads = _job_reads(api, ok)  # the bound (2 + 120) is past 100: counted exactly
    assert len(reads) == 1 and "job.id <" in reads[0].lower(), reads
    assert _pending(api, "alice") == 3


def test_a_limit_changed_by_an_admin_applies_at_once_with_cached_principals(api: Any) -> None:
    """Limits come with the caller's cached principal; a change clears that cache in the
    process that made it (others follow within `token_cache_s`)."""
    api.client.app.state.settings.token_cache_s = 60
    for _ in range(5):
        assert _submit(api).status_code == 201
    assert _submit(api).status_code == 429
    _admin_patch(api, "/api/v1/users/alice", {"max_pending_jobs": 10})
    assert _submit(api).status_code == 201  # 6
    _admin_patch(api, "/api/v1/projects/ml", {"max_pending_jobs": 6})
    refused = _submit(api)
    assert refused.status_code == 429
    assert refused.json()["detail"].startswith("project ml may have at most 6 jobs pending")


def test_a_refusal_counts_what_other_processes_submitted(api: Any) -> None:
    assert _submit(api).status_code == 201  # this API process counts: 1
    insert_jobs(api.factory, user="alice", project="ml", count=3)  # another one: 4
    assert _submit(api).status_code == 201  # 5: the limit
    refused = _submit(api)
    assert refused.status_code == 429, refused.text
    assert refused.json()["detail"].startswith(
        "user alice may have at most 5 jobs pending and has 5"
    )
