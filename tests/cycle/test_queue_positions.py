"""Queue positions are unique and in the policy's order among the jobs the last full cycle
ranked; a job no full cycle ranked yet has none (issue 42 point 2).

As the issue found them: bob's array tasks wait for tomorrow, and jobs of two projects
arrive one at a time, each followed by the quick cycle its submission triggers. A quick
cycle ranks only the head of the queue and the arrivals: the numbers it gave them were
counted among those alone, so arrivals repeated the head's last numbers (position 97,
eighty-eight times) until a full cycle came.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from sqlalchemy import select, update

from app.cycle.run import _without, run_cycle
from app.cycle.snapshot import QueueMemory
from app.db import utcnow
from app.jobs.estimates import NOT_RANKED, RESERVED_FOR_THE_FIRST
from app.jobs.models import Job
from app.jobs.ranking import last
from app.jobs.states import JobStatus
from app.messaging import NullMessenger
from tests.cycle.jobs_api import (
    SETTINGS,
    add_node,
    finish,
    get_job,
    positions,
    statements_while,
    submit,
)
from tests.foundation.builders import insert_jobs, ready_node
from tests.scheduling.builders import job as job_view


def _cycle(api, memory: QueueMemory, *, full: bool):
    return run_cycle(factory=api.factory, messenger=NullMessenger(), settings=SETTINGS,
                     holder="t", now=utcnow(), all_positions=full, memory=memory)  # fmt: skip


def _waiting(api) -> list[tuple[int, int | None, str | None]]:
    """(id, position, reason) of every waiting job, its position as the API shows it."""
    shown = positions(api)
    with api.factory() as session:
        rows = session.execute(
            select(Job.id, Job.pending_reason)
            .where(Job.status == JobStatus.PENDING)
            .order_by(Job.id)
        ).all()
    return [(job_id, shown[job_id], why) for job_id, why in rows]


def _repeated(rows) -> dict[int, int]:
    counts = Counter(position for _, position, _ in rows if position is not None)
    return {position: n for position, n in counts.items() if n > 1}


def _busy_cluster(api) -> QueueMemory:
    """One GPU, taken; bob's 300 tasks begin tomorrow; a full cycle has ranked the queue."""
    with api.factory.begin() as session:
        session.add(ready_node("n1", gpus=1, now=utcnow()))
    submit(api, user="alice", gpus=1)  # takes the only GPU
    insert_jobs(api.factory, user="bob", project="cv", count=300,
                schedule_mode="at", begin_at=utcnow() + timedelta(days=1))  # fmt: skip
    memory = QueueMemory()
    _cycle(api, memory, full=True)
    assert memory.ready
    return memory


def test_arrivals_ranked_by_quick_cycles_never_repeat_a_position(api):
    memory = _busy_cluster(api)
    # More arrivals than a quick cycle's head (64 + 4 per GPU), alternating projects.
    for i in range(90):
        submit(api, user="alice" if i % 2 else "bob", gpus=1, name=f"a{i}")
        _cycle(api, memory, full=False)

    rows = _waiting(api)
    assert _repeated(rows) == {}
    # Not ranked by a full cycle yet: no number, but why it waits.
    unranked = {i: why for i, position, why in rows if position is None and why != "begin_time"}
    assert len(unranked) == 90
    assert set(unranked.values()) == {"waiting_for_gpus"}


def test_a_full_cycle_numbers_the_waiting_jobs_one_to_n_in_policy_order(api):
    memory = _busy_cluster(api)
    for i in range(90):
        submit(api, user="alice" if i % 2 else "bob", gpus=1, name=f"a{i}")
        _cycle(api, memory, full=False)

    _cycle(api, memory, full=True)

    ranked = [(i, p) for i, p, why in _waiting(api) if why != "begin_time"]
    positions = {i: p for i, p in ranked}
    assert sorted(positions.values()) == list(range(1, len(ranked) + 1))
    assert sorted(positions, key=positions.__getitem__) == memory.order


def test_quick_cycles_keep_positions_unique_and_ordered_as_jobs_start(api):
    memory = _busy_cluster(api)
    for i in range(90):
        submit(api, user="alice" if i % 2 else "bob", gpus=1, name=f"a{i}")
    _cycle(api, memory, full=True)
    first = memory.order[0]
    # A second GPU: the first in line starts in a quick cycle, the others move up.
    with api.factory.begin() as session:
        session.add(ready_node("n2", gpus=1, now=utcnow()))
    assert _cycle(api, memory, full=False).placed == 1

    assert get_job(api, first)["status"] == "SCHEDULED"
    rows = [(i, p) for i, p, why in _waiting(api) if p is not None]
    assert _repeated([(i, p, None) for i, p in rows]) == {}
    in_order = [i for i, _ in sorted(rows, key=lambda row: row[1])]
    assert in_order == [i for i in memory.order if i in dict(rows)]
    assert min(p for _, p in rows) == 1  # the next in line is first, not second


def test_every_waiting_job_has_an_estimated_start_or_says_why_none(api):
    with api.factory.begin() as session:
        session.add(ready_node("n1", gpus=1, now=utcnow()))
    running = submit(api, user="alice", gpus=1, estimated_runtime_s=3600)["id"]
    _cycle(api, QueueMemory(), full=True)  # it takes the only GPU, for an hour
    first = submit(api, user="alice", gpus=1)["id"]
    second = submit(api, user="alice", gpus=1)["id"]
    after = submit(api, user="alice", gpus=1, depends_on=[running])["id"]
    held = submit(api, user="alice", gpus=1, hold=True)["id"]
    _cycle(api, QueueMemory(), full=True)
    arrival = submit(api, user="bob", gpus=1)["id"]

    shown = {i: get_job(api, i) for i in (first, second, after, held, arrival)}
    # The first in line has GPUs reserved: a start, as the running job's estimate says.
    assert shown[first]["estimated_start_at"] is not None
    assert shown[first]["estimate_note"] is None
    notes = {i: shown[i]["estimate_note"] for i in (second, after, held, arrival)}
    assert notes == {
        second: RESERVED_FOR_THE_FIRST,
        after: "no estimate: it is not in line until its dependencies end",
        held: "no estimate: held jobs are not in line",
        arrival: NOT_RANKED,
    }
    assert all(shown[i]["estimated_start_at"] is None for i in notes)


def test_the_first_in_line_behind_jobs_of_unknown_end_is_told_why_it_has_no_estimate(api):
    with api.factory.begin() as session:
        session.add(ready_node("n1", gpus=1, now=utcnow()))
    submit(api, user="alice", gpus=1)  # neither an estimate nor a time limit
    _cycle(api, QueueMemory(), full=True)
    first = submit(api, user="alice", gpus=1)["id"]
    second = submit(api, user="alice", gpus=1)["id"]
    _cycle(api, QueueMemory(), full=True)

    shown = {i: get_job(api, i) for i in (first, second)}
    assert [shown[i]["queue_position"] for i in (first, second)] == [1, 2]
    assert shown[first]["estimate_note"] == (
        "no estimate: the GPUs it waits for are held by running jobs with neither a "
        "runtime estimate nor a time limit"
    )
    assert shown[second]["estimate_note"] == RESERVED_FOR_THE_FIRST


def test_the_queue_lists_jobs_that_may_run_apart_from_those_that_cannot_yet(api):
    """GET /queue?eligible=true: the jobs that may run, in line; false: held, dependent
    and begin-time jobs (the Queue page's two sections, issue 42 point 5)."""
    with api.factory.begin() as session:
        session.add(ready_node("n1", gpus=1, now=utcnow()))
    running = submit(api, user="alice", gpus=1)["id"]
    _cycle(api, QueueMemory(), full=True)  # it takes the only GPU
    tomorrow = insert_jobs(api.factory, user="bob", project="cv", count=3,
                           schedule_mode="at", begin_at=utcnow() + timedelta(days=1))  # fmt: skip
    first = submit(api, user="alice", gpus=1)["id"]
    held = submit(api, user="alice", gpus=1, hold=True)["id"]
    after = submit(api, user="alice", gpus=1, depends_on=[running])["id"]
    second = submit(api, user="bob", gpus=1)["id"]
    _cycle(api, QueueMemory(), full=True)

    def queue(**params) -> list[int]:
        r = api.client.get("/api/v1/queue", params=params, headers=api.as_("admin"))
        assert r.status_code == 200, r.text
        assert r.json()["total"] == len(r.json()["items"])
        return [j["id"] for j in r.json()["items"]]

    now = queue(eligible=True)
    assert sorted(now) == sorted([first, second])
    assert [get_job(api, i)["queue_position"] for i in now] == [1, 2]
    assert sorted(queue(eligible=False)) == sorted([*tomorrow, held, after])
    assert sorted(queue()) == sorted([*now, *tomorrow, held, after])


def _keys(api) -> dict[int, int | None]:
    """The queue keys as stored (Job.queue_position), of the waiting jobs."""
    with api.factory() as session:
        return dict(
            session.execute(
                select(Job.id, Job.queue_position).where(Job.status == JobStatus.PENDING)
            ).all()
        )


def _row_versions(api) -> dict[int, int]:
    """Each waiting job's row version, which every write of its row moves."""
    with api.factory() as session:
        return dict(
            session.execute(
                select(Job.id, Job.row_version).where(Job.status == JobStatus.PENDING)
            ).all()
        )


def _queue(api) -> list[tuple[int, int | None]]:
    """(id, position) of the waiting jobs as GET /api/v1/queue lists them, page by page."""
    shown: list[tuple[int, int | None]] = []
    while True:
        r = api.client.get(
            "/api/v1/queue", params={"offset": len(shown), "limit": 20}, headers=api.as_("admin")
        )
        assert r.status_code == 200, r.text
        items = r.json()["items"]
        if not items:
            return shown
        shown.extend((j["id"], j["queue_position"]) for j in items)


def _one_gpu_taken_and_ranked(api, *, waiting: int) -> tuple[int, list[int], QueueMemory]:
    """One GPU, taken by a running job; `waiting` jobs behind it, ranked by a full cycle."""
    add_node(api, 1)
    running = submit(api, user="alice", gpus=1, name="running")["id"]
    behind = [submit(api, user="alice", gpus=1, name=f"w{i}")["id"] for i in range(waiting)]
    memory = QueueMemory()
    _cycle(api, memory, full=True)  # running takes the GPU
    _cycle(api, memory, full=True)
    return running, behind, memory


def test_when_the_head_starts_the_jobs_behind_move_up_without_a_write_of_theirs(api):
    """Issue 42 point 4: a job's place is its index in the stored ranking; when the head
    leaves, the full cycle writes the rows that changed (the placed job, the new head's
    reservation), not one row per waiting job."""
    running, waiting, memory = _one_gpu_taken_and_ranked(api, waiting=60)
    assert _queue(api) == [(job, place) for place, job in enumerate(waiting, start=1)]
    before = _keys(api)
    versions = _row_versions(api)
    finish(api, running)
    _cycle(api, memory, full=True)  # the head starts

    assert get_job(api, waiting[0])["status"] == "SCHEDULED"
    # The jobs behind keep their keys: no position is written (it was one row per job
    # behind the head, 59 here, 20,000 in bench/deep_queue.py). Nor a reason: the GPU the
    # head took this cycle is said taken, as the cycles before and after say it (it was
    # "went to jobs ahead this cycle", then back: two writes of every row per start).
    assert _keys(api) == {job: before[job] for job in waiting[1:]}
    assert _row_versions(api) == {job: versions[job] for job in waiting[1:]}
    _cycle(api, memory, full=True)
    assert _row_versions(api) == {job: versions[job] for job in waiting[1:]}
    assert _queue(api) == [(job, place) for place, job in enumerate(waiting[1:], start=1)]
    # The rank explanation counts the same places.
    r = api.client.get(f"/api/v1/jobs/{waiting[5]}/rank", headers=api.as_("admin"))
    assert r.status_code == 200, r.text
    assert (r.json()["position"], r.json()["waiting"]) == (5, 59)


def test_the_queue_page_follows_the_ranking_and_a_new_order_writes_no_row(api):
    """The Queue page is sorted by the stored ranking, not by a key per job: when the
    order changes (here every job's turn, as when fair share shifts them after a job
    ends), the full cycle stores the new ranking and writes none of the jobs' rows."""
    add_node(api, 1)
    submit(api, user="alice", gpus=1, name="running")
    waiting = [submit(api, user="alice", gpus=1, name=f"w{i}")["id"] for i in range(30)]
    memory = QueueMemory()
    _cycle(api, memory, full=True)
    _cycle(api, memory, full=True)
    assert _queue(api) == [(job, place) for place, job in enumerate(waiting, start=1)]
    keys, versions = _keys(api), _row_versions(api)
    with api.factory() as session:  # the order reversed, by each job's size
        for size, job in enumerate(waiting, start=1):
            session.execute(
                update(Job).where(Job.id == job).values(estimated_runtime_s=600 * (31 - size))
            )
        session.commit()
    versions = _row_versions(api)  # those updates moved them; the cycle must not
    _cycle(api, memory, full=True)

    reversed_order = waiting[::-1]
    assert _queue(api) == [(job, place) for place, job in enumerate(reversed_order, start=1)]
    assert _keys(api) == keys  # no key kept in step with the order
    assert _row_versions(api) == versions


def test_every_page_of_the_queue_is_the_whole_queue_sorted_whichever_way_it_is_found(api):
    """A page among the ranked jobs is found by walking the ranking from its head; past
    them (or under a narrow filter) by sorting every selected id. Pages of any size and
    filter, put together, are the one order: ranked by the ranking (less the jobs placed
    or held since), then the rest by id, held jobs last."""
    add_node(api, 1)
    submit(api, user="alice", gpus=1, name="running")
    ranked = [
        submit(api, user=("alice", "bob")[i % 2], gpus=1, name=f"r{i}",
               estimated_runtime_s=600 * (1 + (i * 7) % 11))["id"]
        for i in range(300)
    ]  # fmt: skip
    memory = QueueMemory()
    _cycle(api, memory, full=True)
    _cycle(api, memory, full=True)
    later = [submit(api, user="bob", gpus=1, name=f"n{i}")["id"] for i in range(5)]  # unranked
    held = submit(api, user="alice", gpus=1, hold=True)["id"]
    with api.factory() as session:  # held since it was ranked
        session.execute(update(Job).where(Job.id == ranked[3]).values(held_by="alice"))
        session.commit()

    def pages(limit: int, **params) -> list[int]:
        shown: list[int] = []
        while True:
            r = api.client.get("/api/v1/queue", headers=api.as_("admin"),
                               params={"offset": len(shown), "limit": limit, **params})  # fmt: skip
            assert r.status_code == 200, r.text
            items = [j["id"] for j in r.json()["items"]]
            if not items:
                assert r.json()["total"] == len(shown)
                return shown
            shown.extend(items)

    with api.factory() as session:
        order = last(session).ids
    waiting = set(_keys(api))
    expected = [
        *(j for j in order if j in waiting and j != ranked[3]),  # the ranking's, less held
        *later,  # not ranked yet, by id
        *sorted([ranked[3], held]),  # held, by id
    ]
    assert len(expected) == len(waiting) == 306
    for limit in (7, 50, 128, 301, 500):
        assert pages(limit) == expected
    bobs = set(ranked[1::2]) | set(later)
    assert pages(20, user="bob") == [j for j in expected if j in bobs]


def test_a_page_of_the_queue_decodes_the_ranking_once_per_ranking(api):
    from sqlalchemy import event

    """The stored ranks (20,000 jobs' worth at depth) are read and decoded once per full
    cycle that rewrites them, not once per request."""
    add_node(api, 1)
    submit(api, user="alice", gpus=1, name="running")
    for i in range(5):
        submit(api, user="alice", gpus=1, name=f"w{i}")
    memory = QueueMemory()
    _cycle(api, memory, full=True)
    _cycle(api, memory, full=True)
    statements: list[str] = []

    def seen(conn, cursor, statement, *_):
        statements.append(statement)

    engine = api.factory.kw["bind"]  # the API and the cycle share it
    event.listen(engine, "before_cursor_execute", seen)
    try:
        for _ in range(3):
            assert [p for _, p in _queue(api)] == [1, 2, 3, 4, 5]
        _cycle(api, memory, full=True)  # nothing changed: the same ranks, a new time
        assert [p for _, p in _queue(api)] == [1, 2, 3, 4, 5]
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    reads = [s for s in statements if "queue_ranking.ranks " in s or "queue_ranking.ranks\n" in s]
    assert len(reads) <= 1, reads


def test_a_quick_cycle_moves_the_queue_up_over_a_ranked_job_cancelled_at_its_head(api):
    memory = _busy_cluster(api)
    waiting = [submit(api, user="alice", gpus=1, name=f"w{i}")["id"] for i in range(5)]
    _cycle(api, memory, full=True)
    assert [p for _, p in _queue(api)][:5] == [1, 2, 3, 4, 5]
    first = memory.order[0]
    r = api.client.post(f"/api/v1/jobs/{first}/cancel", headers=api.as_("admin"))
    assert r.status_code == 200, r.text

    _cycle(api, memory, full=False)

    shown = [(i, p) for i, p in _queue(api) if p is not None]
    assert [p for _, p in shown] == [1, 2, 3, 4]
    assert [i for i, _ in shown] == [i for i in memory.order if i in set(waiting) - {first}]


def test_quick_cycles_list_the_ranked_jobs_they_place_in_one_write_each(api):
    """Each quick cycle that starts ranked jobs appends them to the ranking's departed list
    in the UPDATE itself (no locked read of the row first: a round trip in every cycle of
    a drain); the jobs behind move up across several such cycles."""
    running, waiting, memory = _one_gpu_taken_and_ranked(api, waiting=6)
    for ended in (running, waiting[0]):
        finish(api, ended)
        sent = statements_while(api, lambda: _cycle(api, memory, full=False))  # the head starts
        departed = [s for s in sent if "queue_ranking" in s and "departed" in s]
        assert len(departed) == 1 and departed[0].lstrip().upper().startswith("UPDATE"), sent
    assert [get_job(api, j)["status"] for j in waiting[:2]] == ["SUCCEEDED", "SCHEDULED"]
    assert _queue(api) == [(job, place) for place, job in enumerate(waiting[2:], start=1)]


def test_full_cycles_keep_the_order_and_follow_what_changed(api):
    """The scheduler's full cycles keep the queue's order between them (`KeptOrder`): a job
    raised in priority since the last one goes first, an arrival takes its place, and the
    order is the one a scheduler with no memory works out."""
    memory = _busy_cluster(api)  # one GPU, taken; bob's tasks wait for tomorrow
    ids = [submit(api, user="alice", gpus=1, name=f"j{i}")["id"] for i in range(5)]
    _cycle(api, memory, full=True)
    assert len(memory.kept_order) == len(ids)  # the waiting jobs that may run
    assert [i for i in memory.order if i in ids] == ids

    with api.factory.begin() as session:  # raised: its row (and so its view) changes
        session.execute(update(Job).where(Job.id == ids[-1]).values(priority=5))
    arrival = submit(api, user="alice", gpus=1, name="late")["id"]
    _cycle(api, memory, full=True)

    expected = [ids[-1], *ids[:-1], arrival]
    assert len(memory.kept_order) == len(expected)
    assert [i for i in memory.order if i in expected] == expected
    fresh = QueueMemory()
    _cycle(api, fresh, full=True)
    assert fresh.order == memory.order


def test_the_jobs_a_cycle_placed_leave_the_ranked_order_wherever_they_stood():
    """The ranks are stored from the plan's order less the jobs it placed, looked for from
    the head: one placed deep in the queue (a backfill) or not in it leaves the rest as is."""
    views = [job_view(i) for i in range(1, 11)]
    assert [v.id for v in _without(views, {1, 2, 9})] == [3, 4, 5, 6, 7, 8, 10]
    assert [v.id for v in _without(views, set())] == list(range(1, 11))
    assert [v.id for v in _without(views, {99})] == list(range(1, 11))
