"""A GPU's row follows its UUID (issue 39): NVML's indices are not kept across reboots, and
a GPU that falls off the bus shifts the ones after it. Matched by index, the next GPU took
over the lost one's row (its allocations, history and health); matched by UUID it keeps its
own, and the lost one stays, unhealthy, for the allocations that point at it."""

from __future__ import annotations

from sqlalchemy import select

from app.db import utcnow
from app.nodes.models import Gpu, Node
from app.nodes.telemetry import TelemetryPolicy, ingest_heartbeat, register_node
from app.wire import GpuReading, Heartbeat, Register
from tests.agent.test_agent_nvml_backend import FakeGpu, FakeNvml
from workers.agent.nvml_backend import NvmlGpuBackend
from workers.agent.service import gpu_infos


def _agent_starts(api, fake: FakeNvml) -> None:
    """An agent starting on `fake`'s GPUs registers what NVML lists, as the agent does."""
    info = NvmlGpuBackend(nvml=fake).node_info()
    with api.factory.begin() as session:
        register_node(session=session, report=Register(node="n1", gpus=gpu_infos(info)))


def _rows(api) -> dict[str, tuple[int, int, bool, str]]:
    """uuid -> (row id, index, healthy, health message)."""
    with api.factory() as session:
        node_id = session.scalar(select(Node.id).where(Node.name == "n1"))
        return {
            gpu.uuid: (gpu.id, gpu.index, gpu.healthy, gpu.health_message)
            for gpu in session.scalars(select(Gpu).where(Gpu.node_id == node_id))
        }


def test_a_lost_gpu_keeps_its_row_and_the_others_keep_theirs(api):
    fake = FakeNvml([FakeGpu(uuid=f"GPU-{letter}") for letter in "ABCD"])
    _agent_starts(api, fake)
    first = _rows(api)
    assert {uuid: row[1] for uuid, row in first.items()} == {
        "GPU-A": 0, "GPU-B": 1, "GPU-C": 2, "GPU-D": 3,
    }  # fmt: skip

    del fake.gpus[1]  # GPU-B falls off the bus; after a restart NVML lists three
    _agent_starts(api, fake)
    after = _rows(api)
    assert {uuid: row[0] for uuid, row in after.items()} == {
        uuid: row[0] for uuid, row in first.items()
    }  # every row is the same GPU's as before
    assert after["GPU-C"][1:3] == (1, True) and after["GPU-D"][1:3] == (2, True)
    _id, index, healthy, message = after["GPU-B"]
    assert (index, healthy) == (3, False)
    assert message == "GPU GPU-B is no longer reported by the agent"

    # Readings go to the GPU they are of, whatever index it has now.
    with api.factory.begin() as session:
        ingest_heartbeat(
            session=session,
            heartbeat=Heartbeat(
                node="n1", interval_s=5,
                gpus=(GpuReading(index=1, uuid="GPU-C", util_pct=77.0),),
            ),
            policy=TelemetryPolicy(),
            now=utcnow(),
        )  # fmt: skip
    with api.factory() as session:
        utils = {gpu.uuid: gpu.util_pct for gpu in session.scalars(select(Gpu))}
    assert utils["GPU-C"] == 77.0 and utils["GPU-B"] is None

    # Back after a reboot, in another order: each row takes its GPU's new index.
    fake.gpus = [FakeGpu(uuid=f"GPU-{letter}") for letter in "BADC"]
    _agent_starts(api, fake)
    back = _rows(api)
    assert {uuid: row[0] for uuid, row in back.items()} == {
        uuid: row[0] for uuid, row in first.items()
    }
    assert {uuid: row[1:3] for uuid, row in back.items()} == {
        "GPU-B": (0, True), "GPU-A": (1, True), "GPU-D": (2, True), "GPU-C": (3, True),
    }  # fmt: skip
