"""Pictures of attributions and features: attribution patching's grids (layers × tokens, and
layers × heads), integrated gradients per token, and an SAE's features over a text."""

from __future__ import annotations

from typing import Any

from torch import Tensor


def plot_attribution(
    grid: Tensor, heads: Tensor, *, tokens: list[str], clean: float, corrupt: float
) -> Any:
    """Attribution patching's estimates, as the share of the clean metric each patch would
    restore (0: the corrupted run's metric, 1: the clean run's): the residual stream entering
    each layer at each token (left), and each head at every position (right)."""
    import matplotlib.pyplot as plt

    span = clean - corrupt
    scale = (lambda t: (t - corrupt) / span) if span else (lambda t: t * 0)
    L, T = grid.shape
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(max(7.0, 0.55 * T + 0.45 * heads.size(1) + 4), max(3.2, 0.32 * L + 1.6)),
        layout="constrained", width_ratios=[max(T, 2), max(heads.size(1), 2)],
    )  # fmt: skip
    for ax, values, columns, label in (
        (left, grid, tokens, "position (clean token)"),
        (right, heads, [str(h + 1) for h in range(heads.size(1))], "head"),
    ):
        image = ax.imshow(scale(values).numpy(), aspect="auto", cmap="RdBu", vmin=-1, vmax=1,
                          origin="lower")  # fmt: skip
        ax.set_xticks(range(len(columns)), columns, rotation=90, fontsize=8)
        ax.set_yticks(range(values.size(0)), [f"layer {i + 1}" for i in range(values.size(0))],
                      fontsize=7)  # fmt: skip
        ax.set_xlabel(label)
    left.set_title("residual stream entering each layer", fontsize=10)
    right.set_title("each head (all positions)", fontsize=10)
    fig.suptitle(f"attribution patching: clean {clean:.3f}, corrupted {corrupt:.3f}")
    fig.colorbar(image, ax=right, label="estimated share of the clean metric restored", shrink=0.8)
    return fig


def plot_token_attributions(values: Tensor, *, tokens: list[str], title: str) -> Any:
    """Integrated gradients per token, as bars (red: towards the answer, blue: against)."""
    import matplotlib.pyplot as plt

    T = len(tokens)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.5 * T + 2), 3.4), layout="constrained")
    colours = ["#b2182b" if v >= 0 else "#2166ac" for v in values.tolist()]
    ax.bar(range(T), values.numpy(), color=colours)
    ax.axhline(0, color="#555", linewidth=0.8)
    ax.set_xticks(range(T), tokens, rotation=90, fontsize=8)
    ax.set_ylabel("attribution")
    ax.set_title(title, fontsize=10)
    return fig


def plot_features(values: Tensor, *, tokens: list[str], features: list[int]) -> Any:
    """An SAE's features (rows) over a text's tokens (columns), darker where one fires more."""
    import matplotlib.pyplot as plt

    T, F = len(tokens), len(features)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.5 * T + 2.5), max(2.5, 0.32 * F + 1.4)),
                           layout="constrained")  # fmt: skip
    image = ax.imshow(values.T.numpy(), aspect="auto", cmap="Greens", vmin=0)
    ax.set_xticks(range(T), tokens, rotation=90, fontsize=8)
    ax.set_yticks(range(F), [f"feature {f}" for f in features], fontsize=8)
    ax.set_title("the text's strongest features, where they fire", fontsize=10)
    fig.colorbar(image, ax=ax, label="feature value", shrink=0.8)
    return fig
