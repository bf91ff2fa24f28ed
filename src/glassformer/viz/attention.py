"""Attention heatmaps: each layer's and head's weights, with the tokens on the axes.

``attention_maps(model, tokenizer, text)`` runs one real forward pass asking every
attention layer for its weights and returns them per kind of attention:

    encoder  encoder self-attention (classifier, encoder LM, BERT, sentence encoder,
             the translator's encoder)
    decoder  masked self-attention (GPT, the translator's decoder)
    cross    the translator's decoder attending to the source

``plot_attention(maps)`` draws one kind as a grid (a row per layer, a column per head)
or a single chosen map. Layers and heads count from 1, as the titles do. Each row of a
map is one query token's distribution over the keys: it sums to 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from glassformer.atomic import make_folder, write_atomic
from glassformer.models.base import PretrainedModel
from glassformer.models.sentence import SentenceEncoder
from glassformer.models.seq2seq import Seq2SeqTransformer
from glassformer.modules.attention import MultiHeadAttention

TITLES = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention (causal)",
    "cross": "decoder cross-attention (target → source)",
}
MAX_LABELS = 60  # more tokens than this on an axis: label every k-th one


@dataclass(frozen=True)
class AttentionMaps:
    """One kind of attention for one input: ``weights`` (L, H, Tq, Tk) and the tokens."""

    kind: str
    weights: Tensor
    queries: list[str]
    keys: list[str]

    @property
    def title(self) -> str:
        return TITLES[self.kind]


def token_labels(tokenizer: Any, ids: list[int]) -> list[str]:
    """Readable axis labels: spaces as ␣, newlines as ⏎, GPT-2's Ġ/Ċ markers likewise.

    A byte-level BPE token (GPT-2's scheme, ``kind == "bpe"``) spells its bytes with
    stand-in characters ("Ã³" for the two bytes of "ó"); its label is the text those bytes
    are, a byte that ends no character as ``\\xNN``.
    """
    labels = []
    byte_level = getattr(tokenizer, "kind", None) == "bpe"
    for i in ids:
        token = tokenizer.id_to_token(int(i))
        if byte_level and token and all(c in _BYTE_OF for c in token):
            token = bytes(_BYTE_OF[c] for c in token).decode("utf-8", "backslashreplace")
        token = token.replace("Ġ", "␣").replace("Ċ", "⏎").replace(" ", "␣").replace("\n", "⏎")
        labels.append(token or "∅")
    return labels


def _byte_stand_ins() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character that stands for each byte, reversed.
    Printable Latin-1 bytes stand for themselves; the others are shifted past 255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    others = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + n): b for n, b in enumerate(others)})
    return table


_BYTE_OF = _byte_stand_ins()


def model_inputs(
    model: PretrainedModel, tokenizer: Any, text: str, target: str | None = None
) -> tuple[tuple, dict, dict[str, list[str]]]:
    """What to call ``model`` with for ``text``: (args, kwargs, token labels by role).

    The labels are keyed "input" (and for a translator "source" and "target"). A
    translator without a ``target`` attends from its own greedy translation. For a Vision
    Transformer ``text`` is an image file (``tokenizer`` its ``ImageProcessor``) and the
    tokens are its class token and patches, labelled by their row and column.
    """
    if not text.strip():
        raise ValueError("the text is empty")
    model.eval()
    kind = model.kind
    if kind == "vit":
        return _image_inputs(model, tokenizer, text, target)
    limit = model.config.max_len
    if isinstance(model, Seq2SeqTransformer):
        return _translator_inputs(model, tokenizer, text, target)
    if target is not None:
        raise ValueError(f"a target sentence is for translators; this is a {kind!r} model")
    if isinstance(model, SentenceEncoder):
        ids = model.tokenize([text])[0]
    elif kind in ("bert", "bert_classifier"):
        ids = [tokenizer.bos_id, *tokenizer.encode(text)[: limit - 2], tokenizer.eos_id]
    else:
        ids = tokenizer.encode(text)
        ids = ids[-limit:] if kind == "gpt" else ids[:limit]
    if not ids:
        raise ValueError(f"the text {text!r} encodes to no tokens")
    return (torch.tensor([ids]),), {}, {"input": token_labels(tokenizer, ids)}


def _translator_inputs(model: Seq2SeqTransformer, tokenizer: Any, text: str, target: str | None):
    limit = model.config.max_len
    src_ids = tokenizer.encode(text)[:limit]
    src = torch.tensor([src_ids])
    if target is None:
        ys = model.generate(src, min(limit - 1, 2 * len(src_ids) + 10))[0].tolist()
        if ys[-1] == model.config.eos_id:
            ys = ys[:-1]
    else:
        ys = [model.config.bos_id, *tokenizer.encode(target)[: limit - 1]]
    labels = {"source": token_labels(tokenizer, src_ids), "target": token_labels(tokenizer, ys)}
    return (src, torch.tensor([ys])), {}, labels


def _image_inputs(model: PretrainedModel, processor: Any, path: str, target: str | None):
    if target is not None:
        raise ValueError("a target sentence is for translators; this is a 'vit' model")
    image = processor.open(path)[None]  # (1, C, H, W)
    rows, cols = model.config.grid
    labels = [f"r{r + 1}c{c + 1}" for r in range(rows) for c in range(cols)]
    if model.config.pooling == "cls":
        labels.insert(0, "[class]")
    return (image,), {}, {"input": labels}


def attention_module(model: PretrainedModel, name: str) -> MultiHeadAttention:
    """The attention layer ``name`` names in ``model`` (a TypeError where it is another)."""
    module = model.get_submodule(name)
    if not isinstance(module, MultiHeadAttention):
        raise TypeError(f"{name} is a {type(module).__name__}, not an attention layer")
    return module


def attention_modules(model: PretrainedModel) -> list[tuple[str, str]]:
    """(name, kind) of every attention module: "encoder" (bidirectional self-attention),
    "decoder" (causal self-attention) or "cross" (a translator's decoder reading the source),
    in the order the model runs them."""
    found = []
    for name, module in model.named_modules():
        if not hasattr(module, "hook_pattern"):
            continue
        kind = "cross" if name.endswith("cross_attn") else "decoder" if module.causal else "encoder"
        found.append((name, kind))
    return found


@torch.no_grad()
def attention_maps(
    model: PretrainedModel, tokenizer: Any, text: str, *, target: str | None = None
) -> list[AttentionMaps]:
    """Run ``model`` on ``text`` and return its attention weights, one entry per kind.

    The weights are read at each layer's ``hook_pattern`` (``run_with_cache``): any model
    kind glassformer builds, whatever its blocks.

    Args:
        model: any glassformer model (classifier, encoder LM, GPT, translator, BERT,
            sentence encoder, ViT: ``text`` is then an image file).
        tokenizer: the model's tokenizer (a ViT's image processor).
        text: the input (the source sentence, for a translator).
        target: a translator's target sentence; if None, the model's own greedy
            translation is used.
    """
    args, kwargs, labels = model_inputs(model, tokenizer, text, target)
    _, cache = model.run_with_cache(*args, names="*.hook_pattern", **kwargs)
    return maps_from_cache(model, cache, labels)


def maps_from_cache(
    model: PretrainedModel, cache: Any, labels: dict[str, list[str]]
) -> list[AttentionMaps]:
    """The maps in an ``ActivationCache`` of ``model`` holding every ``hook_pattern``, for
    the inputs ``model_inputs`` gave (whose token ``labels`` these are)."""
    layers: dict[str, list[Tensor]] = {}
    for name, kind in attention_modules(model):
        layers.setdefault(kind, []).append(cache[f"{name}.hook_pattern"][0])
    roles = {"encoder": ("source", "source"), "decoder": ("target", "target"),
             "cross": ("target", "source")}  # fmt: skip
    maps = []
    for kind, weights in layers.items():
        queries, keys = roles[kind] if "source" in labels else ("input", "input")
        stacked = torch.stack(weights).float()  # (L, H, Tq, Tk), the one example
        maps.append(AttentionMaps(kind, stacked, labels[queries], labels[keys]))
    return maps


def plot_attention(maps: AttentionMaps, *, layer: int | None = None, head: int | None = None):
    """A matplotlib Figure of ``maps``: all layers × heads, or one ``layer`` / ``head``
    (counting from 1). Colours share one square-root scale, shown by the colour bar."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    num_layers, num_heads, tq, tk = maps.weights.shape
    layers = _pick("layer", layer, num_layers)
    heads = _pick("head", head, num_heads)
    longest = max(tq, tk)
    if len(layers) * len(heads) == 1:  # one map: room for every token's label
        cell = max(4.0, min(14.0, 0.11 * longest))
    else:
        cell = max(1.6, min(6.0, 0.16 * longest))  # inches per map
    font = max(4.0, min(9.0, 0.8 * cell * 72 / max(1, min(longest, MAX_LABELS))))
    fig, axes = plt.subplots(
        len(layers),
        len(heads),
        figsize=(cell * len(heads) + 1.6, cell * len(layers) + 1.0),
        squeeze=False,
        # Room around every map (inches): the overall title clear of the first row's panel
        # titles, and the bottom row's "key" label clear of the figure's edge.
        layout=ConstrainedLayoutEngine(w_pad=0.08, h_pad=0.12),
    )
    shown = maps.weights[[i - 1 for i in layers]][:, [h - 1 for h in heads]]
    top = float(shown.max()) or 1.0
    # a square-root colour scale: small weights stay visible beside a few large ones
    norm = matplotlib.colors.PowerNorm(gamma=0.5, vmin=0.0, vmax=top)
    for r, li in enumerate(layers):
        for c, hi in enumerate(heads):
            ax = axes[r][c]
            image = ax.imshow(maps.weights[li - 1, hi - 1].numpy(), cmap="viridis", norm=norm)
            ax.set_title(f"layer {li} · head {hi}", fontsize=9)
            _ticks(ax.set_xticks, ax.set_xticklabels, maps.keys, font, rotation=90)
            _ticks(ax.set_yticks, ax.set_yticklabels, maps.queries, font)
            if c > 0:  # in a grid, tokens label only the left column and the bottom row
                ax.set_yticklabels([])
            if r < len(layers) - 1:
                ax.set_xticklabels([])
            if r == len(layers) - 1:
                ax.set_xlabel("key", fontsize=8)
            if c == 0:
                ax.set_ylabel("query", fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    fig.suptitle(f"{maps.title}: {tq} queries × {tk} keys", fontsize=12)
    return fig


def _pick(name: str, chosen: int | None, count: int) -> list[int]:
    if chosen is None:
        return list(range(1, count + 1))
    if not 1 <= chosen <= count:
        raise ValueError(f"{name} must be in 1..{count}, got {chosen}")
    return [chosen]


def _ticks(set_ticks, set_labels, labels: list[str], font: float, rotation: int = 0) -> None:
    step = math.ceil(len(labels) / MAX_LABELS)
    positions = list(range(0, len(labels), step))
    set_ticks(positions)
    set_labels([labels[i] for i in positions], fontsize=font, rotation=rotation)


def save_figure(fig, path) -> None:
    """Save as PNG, SVG or PDF (by suffix), atomically; close the figure."""
    import io
    from pathlib import Path

    import matplotlib.pyplot as plt

    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise ValueError(f"{path}: expected a .png, .svg or .pdf file name")
    make_folder(path.parent)
    image = io.BytesIO()
    try:
        fig.savefig(image, dpi=150, format=path.suffix[1:].lower())
    finally:
        plt.close(fig)
    write_atomic(path, image.getbuffer())
