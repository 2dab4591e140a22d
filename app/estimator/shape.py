"""Parameter counts of a transformer shape, and the shape assumed from a count alone.

Pure arithmetic; the formulas are quoted in ``docs/estimator.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.estimator.schemas import TransformerShape

#: Shape assumptions for a parameters-only request (GPT-3 family, Brown et al. 2020).
ASSUMED_HIDDEN_PER_LAYER = 128
ASSUMED_HEAD_DIM = 128
ASSUMED_VOCAB = 50257
#: Sequence length assumed for a parameters-only request without ``seq_len``.
DEFAULT_SEQ_LEN = 2048


def mlp_matrices(shape: TransformerShape) -> int:
    """h*f matrices in one feed-forward block: 3 when gated (gate, up, down), else 2."""
    return 3 if shape.gated_ffn else 2


def norm_parameters(shape: TransformerShape) -> int:
    """Parameters of one norm: LayerNorm has a weight and a bias, RMSNorm a weight."""
    return 2 * shape.hidden if shape.norm == "layernorm" else shape.hidden


def bias_parameters(shape: TransformerShape) -> int:
    """Biases of one layer: Q, K, V and output (4h), the MLP's f-sized inputs and its output."""
    if not shape.biases:
        return 0
    return 5 * shape.hidden + (mlp_matrices(shape) - 1) * shape.ffn


def layer_parameters(shape: TransformerShape) -> int:
    """One transformer layer: attention 4h^2, MLP g*h*f, biases and its two norms."""
    h = shape.hidden
    return (
        4 * h * h
        + mlp_matrices(shape) * h * shape.ffn
        + bias_parameters(shape)
        + 2 * norm_parameters(shape)
    )


def transformer_parameters(shape: TransformerShape) -> int:
    """Exact parameter count of a decoder-only transformer (see ``FORMULAS["parameters"]``).

    Layers, the input embedding (V*h), a separate output head when untied (V*h more),
    learned positions (s*h; rotary ones have none) and the final norm.  GPT-2 XL gives
    1,557,611,200 and LLaMA-2 7B 6,738,415,616, as published.
    """
    embeddings = (1 if shape.tied_embeddings else 2) * shape.vocab * shape.hidden
    positions = shape.seq_len * shape.hidden if shape.position_embedding == "learned" else 0
    return shape.layers * layer_parameters(shape) + embeddings + positions + norm_parameters(shape)


@dataclass(frozen=True)
class AssumedShape:
    """The shape assumed for a parameter count, and what was changed to fit the parallelism."""

    shape: TransformerShape
    adjustments: tuple[str, ...]


def _layers_for(parameters: int, hidden: int, seq_len: int) -> float:
    """Layers of a GPT shape of ``hidden`` that hold ``parameters`` (not rounded)."""
    probe = TransformerShape.model_construct(
        layers=1, hidden=hidden, heads=1, vocab=ASSUMED_VOCAB, seq_len=seq_len
    )
    outside = transformer_parameters(probe) - layer_parameters(probe)
    return (parameters - outside) / layer_parameters(probe)


def _nearest_multiple(value: float, step: int) -> int:
    return max(step, round(value / step) * step)


def assumed_shape(
    parameters: int,
    seq_len: int | None = None,
    *,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
) -> AssumedShape:
    """Shape assumed for a parameters-only request, splittable by the parallelism asked for.

    GPT-3-family proportions (``h = 128 * L``, head size 128, vocabulary 50257, GPT
    architecture): ``h = (128 * P / 12)^(1/3)`` rounded to a multiple of ``128 * t`` (so
    that t divides the heads), then the layers that hold P at that h, rounded to a
    multiple of p.  ``adjustments`` says what differs from the shape without parallelism.
    """
    s = seq_len if seq_len is not None else DEFAULT_SEQ_LEN
    raw_hidden = (ASSUMED_HIDDEN_PER_LAYER * parameters / 12) ** (1 / 3)

    def shape_for(t: int, p: int) -> tuple[int, int, int]:
        hidden = _nearest_multiple(raw_hidden, ASSUMED_HEAD_DIM * t)
        exact_layers = max(1, round(_layers_for(parameters, hidden, s)))
        return hidden, exact_layers, _nearest_multiple(exact_layers, p)

    base_hidden, _, base_layers = shape_for(1, 1)
    hidden, layers_at_hidden, layers = shape_for(tensor_parallel, pipeline_parallel)
    adjustments: list[str] = []
    if hidden != base_hidden:
        adjustments.append(
            f"heads {base_hidden // ASSUMED_HEAD_DIM} -> {hidden // ASSUMED_HEAD_DIM} "
            f"(hidden {base_hidden} -> {hidden}) so that tensor_parallel={tensor_parallel} "
            "divides them"
        )
        if layers_at_hidden != base_layers:
            adjustments.append(
                f"layers {base_layers} -> {layers_at_hidden} to keep about {parameters:,} "
                f"parameters at hidden {hidden}"
            )
    if layers != layers_at_hidden:
        adjustments.append(
            f"layers {layers_at_hidden} -> {layers} so that pipeline_parallel="
            f"{pipeline_parallel} divides them"
        )
    # Built, not validated: an absurd parallelism may push it past the bounds a request's
    # own shape must respect, and it is still the shape that parallelism implies.
    shape = TransformerShape.model_construct(
        layers=layers,
        hidden=hidden,
        heads=hidden // ASSUMED_HEAD_DIM,
        vocab=ASSUMED_VOCAB,
        seq_len=s,
    )
    return AssumedShape(shape=shape, adjustments=tuple(adjustments))
