"""Pictures of the lenses: the logit lens as a grid of each layer's top token, and an
activation-patching effect as a heatmap (``glassformer lens``, ``glassformer patch``)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from glassformer.inspect import Lens
from glassformer.viz.attention import token_labels


def lens_table(lens: Lens, tokenizer: Any, inputs: list[str], *, width: int = 10) -> str:
    """The lens as text: a row per stage, a column per input token, each cell the stage's
    likeliest next token there (and its probability)."""
    ids, probs = lens.top(1)  # (S, T, 1)
    head = f"{'':>12} " + " ".join(f"{t[:width]:>{width}}" for t in inputs)
    rows = [head]
    for stage, row_ids, row_p in zip(lens.stages, ids[..., 0], probs[..., 0], strict=True):
        tokens = token_labels(tokenizer, row_ids.tolist())
        cells = " ".join(
            f"{f'{t[: width - 5]} {p:.2f}':>{width}}"
            for t, p in zip(tokens, row_p.tolist(), strict=True)
        )
        rows.append(f"{stage:>12} {cells}")
    return "\n".join(rows)


def plot_lens(lens: Lens, tokenizer: Any, inputs: list[str], *, title: str = ""):
    """The lens as a figure: the probability of each stage's top token (colour) with the
    token written in its cell; the input tokens along the bottom."""
    import matplotlib.pyplot as plt

    ids, probs = lens.top(1)
    p = probs[..., 0].numpy()  # (S, T)
    S, T = p.shape
    fig, ax = plt.subplots(
        figsize=(max(6.0, 0.9 * T + 2), max(3.0, 0.35 * S + 1.5)), layout="constrained"
    )
    image = ax.imshow(p, aspect="auto", cmap="Blues", vmin=0.0, vmax=1.0, origin="lower")
    for s in range(S):
        for t, token in enumerate(token_labels(tokenizer, ids[s, :, 0].tolist())):
            colour = "white" if p[s, t] > 0.6 else "black"
            ax.text(t, s, token[:8], ha="center", va="center", fontsize=7, color=colour)
    ax.set_xticks(range(T), [label[:10] for label in inputs], rotation=90, fontsize=8)
    ax.set_yticks(range(S), lens.stages, fontsize=8)
    ax.set_xlabel("input token (each column: the guess for what follows it)")
    ax.set_title(title or "logit lens: each layer's likeliest next token")
    fig.colorbar(image, ax=ax, label="probability of the top token", shrink=0.8)
    return fig


def plot_patching(
    effect: Tensor, *, columns: list[str], column_label: str, clean: float, corrupt: float
):
    """An activation-patching effect (layers × places) as a heatmap, scaled so that 0 is
    the corrupted run's metric and 1 the clean run's."""
    import matplotlib.pyplot as plt

    span = clean - corrupt
    scaled = ((effect - corrupt) / span if span else effect * 0).numpy()
    L, W = scaled.shape
    fig, ax = plt.subplots(
        figsize=(max(5.0, 0.6 * W + 2.5), max(3.0, 0.35 * L + 1.5)), layout="constrained"
    )
    image = ax.imshow(scaled, aspect="auto", cmap="RdBu", vmin=-1, vmax=1, origin="lower")
    ax.set_xticks(range(W), columns, rotation=90, fontsize=8)
    ax.set_yticks(range(L), [f"layer {i + 1}" for i in range(L)], fontsize=8)
    ax.set_xlabel(column_label)
    ax.set_title(f"activation patching: clean {clean:.3f}, corrupted {corrupt:.3f}")
    fig.colorbar(image, ax=ax, label="share of the clean metric restored", shrink=0.8)
    return fig
