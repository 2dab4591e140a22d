"""`gpusched up`'s node names: two stacks on one machine (a demo beside the tests, the real-GPU
check's rehearsal) must not share them, since an agent that starts ends the leftover job
processes of its node's name."""

from __future__ import annotations

from app.cli.up import _agent_plan


def test_simulated_nodes_are_sim_1_and_so_on_by_default() -> None:
    assert _agent_plan("sim:2x4:H100-80GB") == [
        ("sim-1", "sim:4:H100-80GB"),
        ("sim-2", "sim:4:H100-80GB"),
    ]


def test_simulated_nodes_take_the_name_given() -> None:
    assert _agent_plan("sim:2x1:A100-40GB", "lab") == [
        ("lab-1", "sim:1:A100-40GB"),
        ("lab-2", "sim:1:A100-40GB"),
    ]
