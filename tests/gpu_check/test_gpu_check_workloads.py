"""The check's training program is the model `gpusched estimate` describes. Needs PyTorch
(skipped where it is not installed, as in CI); on a CPU, with a small shape:

    PYTHONPATH=. python -m pytest --noconftest tests/gpu_check/test_gpu_check_workloads.py
"""

from __future__ import annotations

import pytest

from bench import gpu_check_workloads as workloads

torch = pytest.importorskip("torch")

SMALL = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 128, "seq_len": 32}


def test_the_model_has_the_parameters_the_estimator_counts() -> None:
    model = workloads.build_model(SMALL, "cpu")
    layers, h, vocab, seq = SMALL["layers"], SMALL["hidden"], SMALL["vocab"], SMALL["seq_len"]
    # docs/estimator.md, GPT's architecture (f = 4h, biases, LayerNorm, learned positions,
    # tied head): P = L*(4h^2 + 2hf + 9h + 4h) + V*h + s*h + 2h.
    estimated = layers * (12 * h * h + 13 * h) + vocab * h + seq * h + 2 * h
    assert sum(p.numel() for p in model.parameters()) == estimated
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_it_trains_in_bf16_with_adamw_states_in_bf16() -> None:
    model = workloads.build_model(SMALL, "cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    first = workloads.train_step(model, optimizer, SMALL, 4).item()
    # Random tokens: the first loss is about ln(vocab), not a blown-up start.
    assert abs(first - torch.log(torch.tensor(float(SMALL["vocab"]))).item()) < 0.5
    states = {s.dtype for state in optimizer.state.values() for s in state.values() if s.dim()}
    assert states == {torch.bfloat16}  # as `estimate --precision bf16` counts them
