"""The GPU programs of the real-GPU check (`bench/gpu_check.py`), run with the machine's own
PyTorch: as gpusched jobs (`train`, `probe`, `worker` under torchrun, `open-gpus`) or
outside the scheduler (`foreign`).

    python bench/gpu_check_workloads.py train --seconds 60
    python bench/gpu_check_workloads.py foreign --seconds 120
    python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        bench/gpu_check_workloads.py worker --seconds 20

Each prints one line `GPU_CHECK_RESULT {json}` at its end, which the check reads from the
job's log. Each stops by itself after its time, so nothing outlives the check even if the
check is killed. `--fake` (the check's rehearsal on simulated GPUs, where there is no
PyTorch) spins the CPU instead and says so in its result: no figure of a fake run is a
hardware reading.

Standard library and PyTorch only: this file runs under an interpreter that has no
gpusched installed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from typing import Any

RESULT_PREFIX = "GPU_CHECK_RESULT "

# The model `train` trains: a GPT-style decoder as app/estimator models one (tied
# embeddings, learned positions, a non-gated 4h MLP, attention scores kept for the
# backward pass), in pure bf16 with AdamW: `gpusched estimate --precision bf16`.
TRAIN_SHAPE = {"layers": 12, "hidden": 2048, "heads": 16, "vocab": 32768, "seq_len": 1024}
TRAIN_MICRO_BATCH = 8


def emit(result: dict[str, object]) -> None:
    print(RESULT_PREFIX + json.dumps(result, sort_keys=True), flush=True)


def spin(seconds: float) -> int:
    """CPU stand-in for GPU work (rehearsal): loop iterations done."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return n


def build_model(shape: dict[str, int], device: Any) -> Any:
    """The GPT-style decoder of TRAIN_SHAPE's kind, in bf16 on `device`."""
    import torch
    from torch import nn

    layers, hidden, heads = shape["layers"], shape["hidden"], shape["heads"]
    vocab, seq = shape["vocab"], shape["seq_len"]

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(hidden)
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.proj = nn.Linear(hidden, hidden)
            self.ln2 = nn.LayerNorm(hidden)
            self.fc1 = nn.Linear(hidden, 4 * hidden)
            self.fc2 = nn.Linear(4 * hidden, hidden)
            mask = torch.ones(seq, seq, dtype=torch.bool).triu(1)
            self.register_buffer("mask", mask, persistent=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, h = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
            q, k, v = (t.view(b, s, heads, h // heads).transpose(1, 2) for t in (q, k, v))
            # Explicit attention (no fused kernel): the scores are kept for the backward
            # pass, as the estimator's activation formula assumes.
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(h // heads))
            probs = scores.masked_fill(self.mask[:s, :s], float("-inf")).softmax(dim=-1)
            x = x + self.proj((probs @ v).transpose(1, 2).reshape(b, s, h))
            return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))

    class Gpt(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens = nn.Embedding(vocab, hidden)
            self.positions = nn.Embedding(seq, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(hidden)
            for table in (self.tokens, self.positions):  # GPT-2's scale: sane first logits
                nn.init.normal_(table.weight, std=0.02)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.tokens(ids) + self.positions.weight[: ids.shape[1]]
            for block in self.blocks:
                x = block(x)
            return self.ln(x) @ self.tokens.weight.t()  # tied output layer

    torch.manual_seed(0)
    with torch.device(device):
        return Gpt().to(torch.bfloat16)


def train_step(model: Any, optimizer: Any, shape: dict[str, int], batch: int) -> Any:
    """One step on random tokens; returns the loss."""
    import torch
    from torch import nn

    vocab, seq = shape["vocab"], shape["seq_len"]
    device = next(model.parameters()).device
    ids = torch.randint(0, vocab, (batch, seq + 1), device=device)
    logits = model(ids[:, :-1])
    loss = nn.functional.cross_entropy(logits.float().view(-1, vocab), ids[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def train(seconds: float, fake: bool) -> None:
    shape, batch = TRAIN_SHAPE, TRAIN_MICRO_BATCH
    if fake:
        spin(seconds)
        emit({"workload": "train", "fake": True, "shape": shape, "micro_batch": batch,
              "max_memory_allocated": None, "max_memory_reserved": None})  # fmt: skip
        return
    import torch

    model = build_model(shape, "cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    # The peak of training, not of building the model (fp32 first, then converted).
    torch.cuda.reset_peak_memory_stats()
    started = time.monotonic()
    steps = 0
    while True:
        loss = train_step(model, optimizer, shape, batch)
        steps += 1
        if steps % 20 == 0:  # .item() waits for the GPU: the loop runs at its pace
            print(f"step {steps} loss {loss.item():.3f}", flush=True)
        if time.monotonic() - started >= seconds:
            break
    torch.cuda.synchronize()
    emit({
        "workload": "train", "fake": False, "steps": steps, "shape": shape, "micro_batch": batch,
        "parameters": sum(p.numel() for p in model.parameters()),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "seconds": round(time.monotonic() - started, 1), "loss": round(loss.item(), 4),
        "device": torch.cuda.get_device_name(0),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    })  # fmt: skip


def matmul_loop(seconds: float, size: int, label: str) -> None:
    """Keeps the GPU busy (utilisation near 100 %) for `seconds`."""
    import torch

    x = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    end = time.monotonic() + seconds
    loops = 0
    print(f"{label}: busy on {torch.cuda.get_device_name(0)}", flush=True)
    while time.monotonic() < end:
        for _ in range(20):
            x = (x @ x).clamp_(-1, 1)
        torch.cuda.synchronize()
        loops += 1
    emit({"workload": label, "fake": False, "loops": loops, "pid": os.getpid(),
          "max_memory_allocated": torch.cuda.max_memory_allocated()})  # fmt: skip


def foreign(seconds: float, fake: bool) -> None:
    if fake:
        print("foreign: busy (fake)", flush=True)
        spin(seconds)
        return
    matmul_loop(seconds, 8192, "foreign")


def worker(seconds: float, fake: bool) -> None:
    """One of torchrun's workers: both share the job's one GPU."""
    rank = os.environ.get("RANK", "?")
    if fake:
        emit({"workload": "worker", "fake": True, "rank": rank, "pid": os.getpid(),
              "loops": spin(seconds)})  # fmt: skip
        return
    matmul_loop(seconds, 4096, f"worker-{rank}")


def fake_torchrun(nproc: int, argv: list[str]) -> int:
    """The rehearsal's torchrun: starts `nproc` workers in sessions of their own, as
    torchrun's elastic agent does, and waits for them."""
    workers = [
        subprocess.Popen(
            [sys.executable, *argv], env={**os.environ, "RANK": str(rank)}, start_new_session=True
        )
        for rank in range(nproc)
    ]
    return max(w.wait() for w in workers)


def probe(seconds: float, fake: bool) -> None:
    """A short job: which GPU it got, then a few seconds of work."""
    if fake:
        emit({"workload": "probe", "fake": True, "loops": spin(seconds)})
        return
    matmul_loop(seconds, 4096, "probe")


def open_gpus() -> None:
    """Which GPU device files this job can open (device isolation: only its own)."""
    opened, refused = [], {}
    for name in sorted(os.listdir("/dev")):
        if not (name.startswith("nvidia") and name[6:].isdigit()):
            continue
        try:
            os.close(os.open(f"/dev/{name}", os.O_RDWR))
            opened.append(name)
        except OSError as exc:
            refused[name] = exc.strerror
    emit({"workload": "open-gpus", "opened": opened, "refused": refused,
          "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")})  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="workload", required=True)
    for name in ("train", "foreign", "worker", "probe"):
        one = sub.add_parser(name)
        one.add_argument("--seconds", type=float, required=True)
        one.add_argument("--fake", action="store_true", help="no GPU: spin the CPU (rehearsal)")
    launcher = sub.add_parser("fake-torchrun")
    launcher.add_argument("--nproc", type=int, default=2)
    launcher.add_argument("rest", nargs=argparse.REMAINDER)
    sub.add_parser("open-gpus")
    args = parser.parse_args(argv)
    if args.workload == "fake-torchrun":
        return fake_torchrun(args.nproc, args.rest)
    if args.workload == "open-gpus":
        open_gpus()
        return 0
    {"train": train, "foreign": foreign, "worker": worker, "probe": probe}[args.workload](
        args.seconds, args.fake
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
