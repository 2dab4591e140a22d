"""GET /api/v1/jobs/{id}/rank (as sprio): a waiting job's place and why, as the last full
cycle ranked it (issue 42 point 3: not the whole queue read and ranked again per request)."""

from __future__ import annotations

from datetime import timedelta

from app.cycle import lease
from app.cycle.run import run_cycle
from app.db import utcnow
from app.messaging import NullMessenger
from tests.cycle.jobs_api import SETTINGS, add_node, grant_priority, run_one_cycle, submit


def _rank(api, job: int, user: str = "alice"):
    return api.client.get(f"/api/v1/jobs/{job}/rank", headers=api.as_(user))


def test_a_waiting_jobs_rank_counts_the_jobs_ahead_by_rule(api):
    add_node(api, 1)
    submit(api, name="running", estimated_runtime_s=3600)
    asked = submit(api, name="asked", estimated_runtime_s=7200)["id"]
    r = _rank(api, asked)
    assert r.status_code == 409 and "has not ranked the queue yet" in r.json()["detail"]
    run_one_cycle(api)  # the first job takes the only GPU
    grant_priority(api)
    submit(api, name="urgent", priority=5)
    submit(api, name="short", estimated_runtime_s=60)
    submit(api, name="long", estimated_runtime_s=36000)
    submit(api, user="bob", name="other-project")
    run_one_cycle(api)  # ranks them
    with api.factory() as session:
        assert lease.ranking(session) == {
            "policy": "default", "starvation_after_s": 0.0, "fair_share_half_life_s": 604800.0,
        }  # fmt: skip
    r = _rank(api, asked)
    assert r.status_code == 200, r.text
    rank = r.json()
    assert (rank["policy"], rank["position"], rank["waiting"]) == ("default", 4, 5)
    assert [(a["rule"], a["jobs"]) for a in rank["ahead"]] == [
        ("priority", 1),
        ("fair_share", 1),  # bob's project cv has used nothing: its turn first
        ("shorter", 1),
    ]
    assert rank["expected_gpu_s"] == 7200 and rank["expected_from"] == "its estimated runtime"
    assert rank["message"].startswith("4 of 5 waiting; ahead of it: 1 by a higher priority")
    # The default policy's LAS queue is named (nothing has run: the first).
    assert rank["las_queue"] == 0 and rank["message"].endswith(
        "it is in LAS queue 0 (0: least GPU-time received)"
    )
    # Only the job's project's members (and admins) see it.
    assert _rank(api, asked, "bob").status_code == 403


def test_a_job_that_is_not_ranked_says_why(api):
    add_node(api, 1)
    running = submit(api, name="running")["id"]
    held = submit(api, name="held", hold=True)["id"]
    after = submit(api, name="after", depends_on=[running])["id"]
    run_one_cycle(api)
    for job, why in (
        (running, f"job {running} is SCHEDULED: only a waiting job has a place in the queue"),
        (held, f"job {held} is held by alice: it is ranked once released"),
        (after, f"job {after} is not in the queue yet: "),
    ):
        r = _rank(api, job)
        assert r.status_code == 409 and r.json()["detail"].startswith(why), r.text
    assert _rank(api, 999).status_code == 404


def test_a_rank_is_what_the_last_full_cycle_ranked_and_an_arrival_says_when_it_will_be(api):
    add_node(api, 1)
    submit(api, name="running")
    asked = submit(api, name="asked")["id"]
    now = utcnow()
    run_cycle(factory=api.factory, messenger=NullMessenger(), settings=SETTINGS, holder="t",
              now=now, full_every_s=5.0)  # fmt: skip
    grant_priority(api)
    arrival = submit(api, name="urgent", priority=5)["id"]

    # Not read again per request: the urgent arrival is not ahead of it until ranked.
    rank = _rank(api, asked).json()
    assert (rank["position"], rank["waiting"], rank["ranked"]) == (1, 1, True)
    r = _rank(api, arrival)
    assert r.status_code == 200, r.text
    late = r.json()
    assert (late["ranked"], late["position"], late["ahead"]) == (False, None, [])
    assert late["next_ranking_at"] is not None
    assert late["message"].startswith("not ranked yet: the next full cycle ranks it, within ")

    run_one_cycle(api)  # the next full cycle
    assert _rank(api, arrival).json()["position"] == 1
    moved = _rank(api, asked).json()
    assert (moved["position"], moved["ahead"][0]["rule"]) == (2, "priority")


def test_an_arrival_after_a_late_full_cycle_is_ranked_by_the_next_one(api):
    add_node(api, 1)
    submit(api, name="running")
    long_ago = utcnow() - timedelta(minutes=5)
    run_cycle(factory=api.factory, messenger=NullMessenger(), settings=SETTINGS, holder="t",
              now=long_ago, full_every_s=5.0)  # fmt: skip
    arrival = submit(api, name="new")["id"]
    late = _rank(api, arrival).json()
    assert (late["ranked"], late["next_ranking_at"]) == (False, None)
    assert late["message"] == "not ranked yet: the scheduler's next full cycle ranks it"


def test_a_ranking_stored_by_an_older_scheduler_is_not_read_until_replaced(api):
    """After an upgrade the stored ranking may be in an older layout (the counts per job):
    the API neither fails on it nor reads it as this one; the next full cycle replaces it."""
    from sqlalchemy import update

    from app.jobs.ranking import ROW, QueueRanking

    add_node(api, 1)
    submit(api, name="running")
    waiting = submit(api, name="waiting")["id"]
    run_one_cycle(api)
    with api.factory() as session:
        session.execute(
            update(QueueRanking)
            .where(QueueRanking.name == ROW)
            .values(ranks={"ids": [waiting], "ahead": {}, "size": [1.0]}, ranks_id="old")
        )
        session.commit()
    r = _rank(api, waiting)
    assert r.status_code == 409 and "has not ranked the queue yet" in r.json()["detail"]
    queue = api.client.get("/api/v1/queue", headers=api.as_("alice"))
    assert queue.status_code == 200 and queue.json()["items"][0]["queue_position"] is None
    run_one_cycle(api)
    assert _rank(api, waiting).json()["position"] == 1


def test_the_packed_order_reads_back_as_it_was_written():
    """Ids and classes as 32-bit numbers, whatever the machine's byte order."""
    from app.jobs.ranking import pack, unpack

    ids, of = [7, 2**31 - 1, -2, 3], [0, 5, 65536, 1]
    packed = pack(ids, of)
    assert len(packed) == 4 * (len(ids) + len(of))
    assert packed[:4] == (7).to_bytes(4, "little")
    assert unpack(packed) == (ids, of)
    assert unpack(pack([], [])) == ([], [])
