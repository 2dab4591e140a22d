"""nodes, queues, drain, undrain, remove-node."""

from __future__ import annotations

import json

from sqlalchemy import select

from app.db import utcnow
from app.nodes.models import Gpu, Node, NodeState
from tests.cli.harness import Cli


def _add_node(
    cli: Cli,
    name: str,
    gpus: int,
    model: str = "NVIDIA H100 80GB HBM3",
    state: NodeState = NodeState.READY,
) -> None:
    with cli.factory() as session:
        node = Node(
            name=name,
            hostname=f"{name}.local",
            state=state,
            last_heartbeat_at=utcnow(),
            gpus=[
                Gpu(index=i, uuid=f"GPU-{name}-{i}", model=model, memory_total_mb=81559)
                for i in range(gpus)
            ],
        )
        session.add(node)
        session.commit()


def test_nodes_table_and_json(cli: Cli) -> None:
    result = cli("nodes")
    assert result.exit_code == 0 and "no nodes" in result.stdout

    _add_node(cli, "gpu-a", 8)
    _add_node(cli, "gpu-b", 2, model="NVIDIA A100-SXM4-40GB")
    result = cli("nodes")
    assert result.exit_code == 0, result.stderr
    for text in ("gpu-a", "gpu-b", "READY", "0/8", "8x NVIDIA H100 80GB HBM3", "2x NVIDIA A100"):
        assert text in result.stdout

    listed = json.loads(cli("nodes", "--json").stdout)
    assert [n["name"] for n in listed] == ["gpu-a", "gpu-b"]
    assert listed[0]["gpu_count"] == 8


def test_queues_table_and_json(cli: Cli) -> None:
    for _ in range(2):
        assert cli("submit", "--gpus", "2", "--", "true").exit_code == 0
    assert cli("submit", "--", "true", user="bob").exit_code == 0
    assert cli("submit", "--hold", "--", "true", user="bob").exit_code == 0

    from sqlalchemy import update

    from app.projects.models import Project

    with cli.factory.begin() as session:  # as a full cycle writes it: ml used 3 GPU-hours
        session.execute(update(Project).where(Project.name == "ml").values(usage_gpu_s=10800))
    result = cli("queues", user="admin")
    assert result.exit_code == 0, result.stderr
    rows = {
        cells[0]: cells[-3:]
        for line in result.stdout.splitlines()
        if line.startswith(("┃", "│"))
        for cells in [[c.strip() for c in line.strip("┃│").replace("┃", "│").split("│")]]
    }
    assert rows["PROJECT"] == ["WEIGHT", "SHARE", "USED"]
    pending = {
        cells[0]: cells[1]
        for line in result.stdout.splitlines()
        if line.startswith("│")
        for cells in [[c.strip() for c in line.strip("│").split("│")]]
    }
    assert (pending["ml"], pending["cv"]) == ("2", "2 (1 held)")
    assert rows["ml"] == ["1", "33%", "100% (3.0 GPU-h)"]
    assert rows["cv"] == ["1", "33%", "0% (0.0 GPU-h)"]

    queues = {q["project"]: q for q in json.loads(cli("queues", "--json", user="admin").stdout)}
    assert queues["ml"]["pending"] == 2 and queues["ml"]["gpus_requested"] == 4
    assert (queues["cv"]["pending"], queues["cv"]["held"]) == (2, 1)
    assert queues["ml"]["held"] == 0


def test_drain_and_undrain(cli: Cli) -> None:
    _add_node(cli, "gpu-a", 1)
    result = cli("drain", "gpu-a", "--reason", "bad fan", user="admin")
    assert result.exit_code == 0, result.stderr
    assert "gpu-a" in result.stdout and "bad fan" in result.stdout

    nodes = cli("nodes", user="admin")
    assert "DRAINED" in nodes.stdout and "bad fan" in nodes.stdout

    undrained = cli("undrain", "--json", "gpu-a", user="admin")
    assert undrained.exit_code == 0, undrained.stderr
    assert json.loads(undrained.stdout)["drained"] is False

    denied = cli("drain", "gpu-a", user="alice")
    assert denied.exit_code == 1 and "admin role required" in denied.stderr

    missing = cli("drain", "nope", user="admin")
    assert missing.exit_code == 1 and "nope" in missing.stderr


def test_remove_node(cli: Cli) -> None:
    _add_node(cli, "gpu-a", 1)
    _add_node(cli, "gpu-old", 4, state=NodeState.NOT_READY)

    running = cli("remove-node", "gpu-a", user="admin")
    assert running.exit_code == 1
    assert "node gpu-a is READY (its agent heartbeats): stop its agent first" in running.stderr
    assert cli("remove-node", "gpu-old", user="alice").exit_code == 1

    removed = cli("remove-node", "gpu-old", user="admin")
    assert removed.exit_code == 0, removed.stderr
    assert removed.stdout == (
        "node gpu-old removed (4 GPUs); its agent registering again brings it back\n"
    )
    assert "gpu-old" not in cli("nodes").stdout
    again = cli("remove-node", "--json", "gpu-old", user="admin")
    assert again.exit_code == 1 and "node gpu-old was removed at" in again.stderr


def test_drain_at_plans_a_maintenance(cli: Cli) -> None:
    _add_node(cli, "gpu-a", 1)
    at = "2099-01-05T08:00:00+00:00"
    result = cli("drain", "gpu-a", "--at", at, "--reason", "driver upgrade", user="admin")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("node gpu-a: maintenance from 2099-01-05 ")
    assert result.stdout.rstrip().endswith(
        "until then only jobs whose time limit ends by then start there (driver upgrade)"
    )
    node = json.loads(cli("nodes", "--json", user="admin").stdout)[0]
    assert (node["drained"], node["maintenance_at"]) == (False, "2099-01-05T08:00:00Z")
    listing = cli("nodes", user="admin").stdout
    assert "READY,MAINT" in listing and "maintenance from 2099-01-05" in listing
    for args, message in (
        (("--at", "next tuesday"), "--at: 'next tuesday': expected an ISO 8601 time"),
        (("--at", at, "--requeue"), "--at and --requeue exclude each other"),
    ):
        bad = cli("drain", "gpu-a", *args, user="admin")
        assert bad.exit_code == 2 and message in bad.stderr, bad.stderr


def test_drain_with_requeue_moves_the_running_jobs_elsewhere(cli: Cli) -> None:
    from app.jobs.lifecycle import transition
    from app.jobs.models import Job
    from app.jobs.states import JobStatus
    from app.nodes.models import Allocation

    _add_node(cli, "gpu-a", 1)
    empty = cli("drain", "gpu-a", "--requeue", user="admin")
    assert empty.exit_code == 0, empty.stderr
    assert empty.stdout.splitlines()[-1] == "no job was running there"

    job_id = json.loads(cli("submit", "--json", "--name", "train", "--", "sleep", "9").stdout)["id"]
    with cli.factory.begin() as session:  # placed on gpu-a and running, as the agent says
        job = session.get_one(Job, job_id)
        job.attempt = 1
        for step in (JobStatus.SCHEDULED, JobStatus.RUNNING):
            transition(session, job=job, to=step, actor="agent:gpu-a")
        gpu = session.scalars(select(Gpu)).one()
        session.add(
            Allocation(
                job_id=job_id, attempt=1, node_id=gpu.node_id, gpu_id=gpu.id, share_milli=1000
            )
        )
    moved = cli("drain", "gpu-a", "--requeue", "--reason", "firmware", user="admin")
    assert moved.exit_code == 0, moved.stderr
    assert moved.stdout == (
        "node gpu-a drained: firmware\n"
        f"requeued jobs {job_id} (train): they stop within their grace period and run elsewhere\n"
    )
    as_json = json.loads(cli("drain", "gpu-a", "--requeue", "--json", user="admin").stdout)
    assert as_json["node"]["drained"] is True
    assert [j["id"] for j in as_json["requeued"]] == [job_id]  # still stopping: asked again


def test_quota_notes_guarantees_beyond_the_cluster(cli: Cli) -> None:
    _add_node(cli, "gpu-a", 8)
    fits = cli("quota", "ml", "--gpus", "6", user="admin")
    assert fits.exit_code == 0 and fits.stderr == ""
    beyond = cli("quota", "cv", "--gpus", "4", user="admin")
    # Allowed (a guarantee may be over-committed on purpose), but said.
    assert beyond.exit_code == 0 and beyond.stdout.startswith("project cv: 4 GPUs guaranteed")
    assert beyond.stderr.strip() == (
        "note: guarantees now sum to 10 GPUs, more than the cluster's 8: they cannot all be"
        " honoured at once"
    )


def test_quota_sets_guarantee_and_weight(cli: Cli) -> None:
    result = cli("quota", "ml", "--gpus", "8", "--weight", "2", user="admin")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == (
        "project ml: 8 GPUs guaranteed, fair-share weight 2 (0 GPUs in use, 0 jobs pending)"
    )
    shown = cli("queues", "--json", user="admin")
    ml = next(q for q in json.loads(shown.stdout) if q["project"] == "ml")
    assert (ml["gpu_quota"], ml["weight"]) == (8, 2.0)

    cleared = cli("quota", "ml", "--gpus", "0", "--json", user="admin")
    assert json.loads(cleared.stdout)["gpu_quota"] == 0
    assert (
        "no guarantee, fair-share weight 2"
        in cli("quota", "ml", "--weight", "2", user="admin").stdout
    )

    nothing = cli("quota", "ml", user="admin")
    assert nothing.exit_code == 2
    assert (
        "give --gpus, --weight, --max-runtime, --max-priority, --max-pending, --max-running "
        "or --max-gpus" in " ".join(nothing.stderr.split())
    )
    negative = cli("quota", "ml", "--gpus", "-1", user="admin")
    assert negative.exit_code == 2 and "--gpus" in negative.stderr
    zero = cli("quota", "ml", "--weight", "0", user="admin")
    assert zero.exit_code == 1 and "weight: Input should be greater than 0" in zero.stderr
    denied = cli("quota", "ml", "--gpus", "1", user="alice")
    assert denied.exit_code == 1 and "admin role required" in denied.stderr
    missing = cli("quota", "nlp", "--gpus", "1", user="admin")
    assert (
        missing.exit_code == 1
        and "no project named 'nlp'; projects: cv, default, ml" in missing.stderr
    )


def test_quota_sets_a_projects_longest_time_limit(cli: Cli) -> None:
    result = cli("quota", "ml", "--max-runtime", "4h", user="admin")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == (
        "project ml: no guarantee, fair-share weight 1, jobs at most 4h"
        " (0 GPUs in use, 0 jobs pending)"
    )
    too_long = cli("submit", "--max-runtime", "5h", "--", "true")
    assert too_long.exit_code == 1
    assert "above the longest time limit of project ml, 14400 s (4h)" in too_long.stderr
    job = json.loads(cli("submit", "--json", "--", "true").stdout)
    assert job["max_runtime_s"] == 4 * 3600  # none asked: the project's longest
    cleared = cli("quota", "ml", "--max-runtime", "none", "--json", user="admin")
    assert json.loads(cleared.stdout)["max_runtime_s"] is None
    assert cli("submit", "--max-runtime", "5h", "--", "true").exit_code == 0
    bad = cli("quota", "ml", "--max-runtime", "soon", user="admin")
    assert bad.exit_code == 2 and "--max-runtime" in bad.stderr


def test_quota_grants_a_projects_users_a_higher_priority(cli: Cli) -> None:
    """As Slurm: users may only lower their jobs' priority; an admin lets a project's
    users give up to a maximum."""
    refused = cli("submit", "--priority", "5", "--", "true")
    assert refused.exit_code == 1
    assert "only an admin gives a job a higher priority" in " ".join(refused.stderr.split())
    granted = cli("quota", "ml", "--max-priority", "5", user="admin")
    assert granted.exit_code == 0, granted.stderr
    assert "users give priority up to 5" in granted.stdout
    assert cli("submit", "--priority", "5", "--", "true").exit_code == 0
    assert cli("submit", "--priority", "6", "--", "true").exit_code == 1
    shown = cli("queues", "--json")
    assert [q["max_priority"] for q in json.loads(shown.stdout)] == [5]
    denied = cli("quota", "ml", "--max-priority", "9", user="alice")
    assert denied.exit_code == 1 and "admin role required" in denied.stderr
    beyond = cli("quota", "ml", "--max-priority", "1001", user="admin")
    assert beyond.exit_code == 2 and "--max-priority" in beyond.stderr


def test_nodes_say_how_jobs_are_fenced_and_whose_account_they_run_as(cli: Cli) -> None:
    from app.nodes.telemetry import register_node
    from app.wire import Register

    with cli.factory.begin() as session:
        register_node(session=session, report=Register(node="gpu-a", isolation="cgroup v1"))
        register_node(
            session=session,
            report=Register(node="laptop", isolation="subreaper only", jobs_run_as="carol"),
        )
        node = session.scalars(select(Node).where(Node.name == "gpu-a")).one()
        node.unusable_accounts = {"dave": "no such account on this node"}
    result = cli("nodes")
    assert result.exit_code == 0, result.stderr
    flat = " ".join(result.stdout.split())
    for text in ("ISOLATION", "JOBS RUN AS", "cgroup v1", "subreaper only",
                 "single-user: jobs run as carol", "each its owner's",
                 "cannot run jobs as dave (no such account on this node)"):  # fmt: skip
        assert text in flat, (text, result.stdout)


def test_nodes_say_why_a_gpu_takes_no_jobs(cli: Cli) -> None:
    _add_node(cli, "gpu-a", 3)
    with cli.factory.begin() as session:
        sick, unknown, sliced = session.scalars(select(Gpu).order_by(Gpu.index)).all()
        sick.healthy, sick.health_message = False, "XID 79"
        unknown.unknown_readings = ["processes: NoPermission"]
        sliced.mig_enabled = True
    result = cli("nodes")
    assert result.exit_code == 0, result.stderr
    flat = " ".join(result.stdout.split())
    notes = json.loads(cli("nodes", "--json").stdout)[0]["gpus"]
    assert [(g["healthy"], g["unknown_readings"], g["mig_enabled"]) for g in notes] == [
        (False, [], False),
        (True, ["processes: NoPermission"], False),
        (True, [], True),
    ]
    for text in ("GPU 0 unhealthy: XID 79", "GPU 1 unknown: processes: NoPermission",
                 "GPU 2 MIG enabled"):  # fmt: skip
        assert text in flat, (text, result.stdout)
