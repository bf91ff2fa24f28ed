"""The interactive attention viewer: one self-contained HTML file, offline.

``attention_html(model, tokenizer, text)`` runs one real forward pass with
``run_with_cache`` and reads every attention module's weights (``hook_pattern``) and its
queries and keys per head (``hook_rot_q``/``hook_rot_k`` where it rotates them by position,
else ``hook_q``/``hook_k``; keys per key/value head under grouped-query attention). The
page it returns shows three views of them:

    head view    the tokens in two columns, a line per (query, key) pair whose opacity is
                 the weight; a layer and a head chosen with selectors
    model view   every layer × head as a small map; click one to open it in the head view
    neuron view  for one query and key, the products q_d·k_d/√Dh, one per dimension d of
                 the head, whose sum is the score softmax turns into the weight

The page is one file: the data is JSON inside ``<script type="application/json">`` (tensors
as little-endian float32 in base64), the scripts and style are the package files
``html/*.js`` and ``html/viewer.css`` inlined, and a Content-Security-Policy allows no
network and no script but those. Tokens reach the page only as data and are put
into it as text (``textContent``), never as markup.

Size: the page holds, per kind of attention, L·H·Tq·Tk weights and L·(H·Tq + Hkv·Tk)·Dh
query and key values, 4 bytes each before base64. Beyond ``MAX_NUMBERS`` it is refused.
"""

from __future__ import annotations

import base64
import html
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from glassformer.atomic import make_folder, write_atomic
from glassformer.inspect import logit_lens
from glassformer.inspect.lens import readout
from glassformer.models.base import PretrainedModel
from glassformer.viz.attention import (
    TITLES,
    attention_module,
    attention_modules,
    maps_from_cache,
    model_inputs,
    token_labels,
)
from glassformer.viz.page import render

MAX_NUMBERS = 8_000_000  # about 43 MB of page; the browser holds each number as 4 bytes
# classic scripts, in order, sharing the page's scope: data and helpers, the views, controls
SCRIPTS = ("helpers.js", "data.js", "views.js", "extras.js", "viewer.js")
EXPLAIN_SCRIPTS = ("helpers.js", "explain-derive.js", "explain-flow.js", "explain-tour.js",
                   "explain.js")  # fmt: skip
# the live page's: the tokenizer and the forward pass, before the page's own
LIVE_SCRIPTS = ("helpers.js", "explain-derive.js", "live-tokenize.js", "live-forward.js",
                "explain-flow.js", "explain-tour.js", "explain.js")  # fmt: skip
_ASSETS = ("page.html", "viewer.html", "viewer.css", *SCRIPTS, "explain.html", "explain.css",
           *EXPLAIN_SCRIPTS, "graph.html", "graph.css", "graph.js", "circuit.html", "circuit.css",
           "circuit.js", "live-tokenize.js", "live-forward.js")  # fmt: skip


@dataclass(frozen=True)
class AttentionView:
    """An HTML page of a model's attention: ``save(path)`` writes it, a notebook shows it."""

    html: str

    def save(self, path: str | os.PathLike) -> Path:
        """Write the page to ``path`` (atomically) and return the path."""
        path = Path(path)
        make_folder(path.parent)
        write_atomic(path, self.html.encode("utf-8"))
        return path

    def _repr_html_(self) -> str:
        # An iframe keeps the page's ids, style and policy apart from the notebook's.
        page = html.escape(self.html, quote=True)
        return f'<iframe srcdoc="{page}" style="width:100%;height:760px;border:0"></iframe>'


@torch.no_grad()
def attention_html(
    model: PretrainedModel,
    tokenizer: Any,
    text: str,
    *,
    target: str | None = None,
    title: str | None = None,
) -> AttentionView:
    """The attention viewer page for ``model`` on ``text``.

    Args:
        model: any glassformer model ``attention_maps`` takes.
        tokenizer: the model's tokenizer.
        text: the input (a translator's source sentence).
        target: a translator's target sentence; if None, its own greedy translation.
        title: the page's heading (default: the model's kind and size).

    Raises:
        ValueError: the page would hold more than ``MAX_NUMBERS`` numbers.
    """
    return AttentionView(
        render_page(attention_data(model, tokenizer, text, target=target, title=title))
    )


def attribution_page(
    model: PretrainedModel, tokenizer: Any, text: str, result: dict
) -> AttentionView:
    """The viewer for ``text`` with its attribution tab open: integrated gradients per token
    and, where ``result`` has them, attribution patching's grids (``glassformer attribute``)."""
    data = attention_data(model, tokenizer, text)
    extra = {"tokens": result["tokens"], "metric": result["metric"],
             "integrated": [round(v, 6) for v in result["integrated"].tolist()]}  # fmt: skip
    if "grid" in result:
        extra.update(clean=result["clean"], corrupt=result["corrupt"],
                     grid=_rounded(result["grid"]), heads=_rounded(result["heads"]))  # fmt: skip
    return AttentionView(render_page({**data, "attribution": extra, "open": "attribution"}))


def features_page(model: PretrainedModel, tokenizer: Any, text: str, result: dict) -> AttentionView:
    """The viewer for ``text`` with its features tab open: an SAE's strongest features over
    the tokens and each one's top contexts (``glassformer features``)."""
    data = attention_data(model, tokenizer, text)
    extra = {"tokens": result["tokens"], "features": result["features"], "sae": result["sae"],
             "values": _rounded(result["values"]),
             "contexts": [result["contexts"][f] for f in result["features"]]}  # fmt: skip
    return AttentionView(render_page({**data, "features": extra, "open": "features"}))


def directions_page(
    model: PretrainedModel, tokenizer: Any, text: str, path: str | Path, hook: str | None = None
) -> AttentionView:
    """The viewer for ``text`` with its directions tab open: each token's projection on the
    class difference of each hook of a probes file (``projections``), as a track for
    ``hook`` (default: the best probe's) and a grid of every hook (``glassformer attention
    --vector``)."""
    from glassformer.inspect.probes import projections

    data = attention_data(model, tokenizer, text)
    args, _, labels = model_inputs(model, tokenizer, text)
    found = projections(model, args[0], path)
    if hook is not None and hook not in found["hooks"]:
        raise ValueError(f"{path} holds no vector at {hook!r}; it has "
                         f"{', '.join(found['hooks'])}")  # fmt: skip
    chosen = found["hooks"].index(hook or found["best"])
    extra = {"tokens": labels["input"], "hooks": found["hooks"], "chosen": chosen,
             "values": _rounded(found["values"]), "labels": found["labels"],
             "accuracy": [found["accuracy"].get(h) for h in found["hooks"]],
             "file": Path(path).name}  # fmt: skip
    return AttentionView(render_page({**data, "directions": extra, "open": "directions"}))


def _rounded(t: Tensor) -> list:
    return [[round(v, 6) for v in row] for row in t.tolist()]


def attention_data(
    model: PretrainedModel,
    tokenizer: Any,
    text: str,
    *,
    target: str | None = None,
    title: str | None = None,
) -> dict[str, Any]:
    """What the page shows, as the JSON-ready dict it embeds (see ``render_page``)."""
    args, kwargs, labels = model_inputs(model, tokenizer, text, target)
    modules = attention_modules(model)
    _check_size(model, modules, labels)
    looked_at = ("hook_pattern", "hook_q", "hook_k", "hook_rot_q", "hook_rot_k", "hook_pos_bias",
                 "hook_router_weights")  # fmt: skip
    _, cache = model.run_with_cache(*args, names=lambda name: name.endswith(looked_at), **kwargs)
    kinds = []
    for maps in maps_from_cache(model, cache, labels):
        names = [name for name, kind in modules if kind == maps.kind]
        q = torch.stack([_heads(cache, name, "q") for name in names])  # (L, H, Tq, Dh)
        k = torch.stack([_heads(cache, name, "k") for name in names])  # (L, Hkv, Tk, Dh)
        kinds.append(
            {
                "kind": maps.kind,
                "title": maps.title,
                "causal": maps.kind == "decoder",
                "rotary": f"{names[0]}.hook_rot_q" in cache,
                "queries": maps.queries,
                "keys": maps.keys,
                "layers": q.size(0),
                "heads": q.size(1),
                "kvHeads": k.size(1),
                "headDim": q.size(-1),
                "scale": _scale(model, names[0]),
                "notes": _score_notes(model, names[0]),
                "bias": _position_bias(cache, names[0]),
                "weights": base64_floats(maps.weights),
                "q": base64_floats(q),
                "k": base64_floats(k),
            }
        )
    first = kinds[0]
    size = f"{first['layers']} layers × {first['heads']} heads of {first['headDim']}"
    return {
        "title": title or f"{model.kind} model, {size}",
        "text": text,
        "target": target,
        "kinds": kinds,
        "lens": lens_data(model, tokenizer, args[0], labels.get("input", [])),
        "experts": experts_data(model, cache, labels.get("input", [])),
    }


def experts_data(model: PretrainedModel, cache: Any, tokens: list[str]) -> dict | None:
    """A mixture of experts' routing for the page: for each routed layer, each token's
    weight for each expert (0 where not chosen); None for a model without experts."""
    names = [n for n in cache if n.startswith("blocks.") and n.endswith("mlp.hook_router_weights")]
    routed = [(int(name.split(".")[1]), name) for name in names]
    if not routed:
        return None
    moe = model.get_submodule(routed[0][1].rsplit(".", 1)[0])
    return {
        "tokens": tokens,
        "layers": [layer for layer, _ in routed],
        "experts": moe.num_experts,
        "k": moe.top_k,
        "normalize": moe.normalize,
        "weights": [_rounded(cache[name][0].float()) for _, name in routed],
    }


def _scale(model: PretrainedModel, attention: str) -> float:
    """What q·k is multiplied by in ``attention``'s scores: 1/√Dh, or its own (Gemma, T5)."""
    attn = attention_module(model, attention)
    return attn.scale if attn.scale is not None else attn.head_dim**-0.5


def _position_bias(cache: Any, attention: str) -> str | None:
    """What every layer of a self-attention's stack adds to its scores for the positions,
    (H, Tq, Tk) of the first example (T5's relative buckets), or None."""
    if not attention.endswith(".attn"):
        return None  # cross-attention has none
    stack = attention.split("blocks.")[0]
    bias = cache.get(f"{stack}hook_pos_bias")
    return None if bias is None else base64_floats(bias[0])


def _score_notes(model: PretrainedModel, attention: str) -> list[str]:
    """What ``attention``'s scores hold beyond the scaled q·k: T5's position bias (which
    the neuron view adds, from the page's ``bias``), a soft cap or a window (which its
    softmax leaves out; the model's weight, shown beside it, includes them)."""
    attn = attention_module(model, attention)
    stack = model.get_submodule(attention.split("blocks.")[0].rstrip(".") or "")
    notes = []
    if getattr(stack, "relative_bias", None) is not None and attention.endswith(".attn"):
        notes.append(
            "The scores also get a learned bias for each distance (T5's relative positions)."
        )
    if attn.softcap is not None:
        notes.append(f"The scores are soft-capped at ±{attn.softcap:g} (Gemma 2).")
    if attn.window is not None:
        notes.append(
            f"Each query reads its last {attn.window[0] + 1} keys only (a sliding window)."
        )
    return notes


def _heads(cache: Any, attention: str, which: str) -> Tensor:
    """One attention module's queries (H, Tq, Dh) or keys (Hkv, Tk, Dh) of the first example
    as its scores were made of them: rotated by position where it uses rotary positions.
    The score of query i and key j in head h is q[h, i] · k[h // (H / Hkv), j] / √Dh."""
    rotated = f"{attention}.hook_rot_{which}"
    name = rotated if rotated in cache else f"{attention}.hook_{which}"
    return cache[name][0].transpose(0, 1).float()  # (T, H, Dh) → (H, T, Dh)


def _check_size(model: PretrainedModel, modules: list[tuple[str, str]], labels: dict) -> None:
    """Refuse a page over ``MAX_NUMBERS`` numbers before computing it."""
    lengths = _lengths(labels)
    found = dict(model.named_modules())
    numbers = 0
    for name, kind in modules:
        m = found[name]
        tq, tk = lengths[kind]
        numbers += m.num_heads * tq * (tk + m.head_dim) + m.num_kv_heads * tk * m.head_dim
    if numbers > MAX_NUMBERS:
        raise ValueError(
            f"the page would hold {numbers:,} numbers (layers × heads × (tokens² + tokens × "
            f"head dim)), over the limit of {MAX_NUMBERS:,}; use a shorter text"
        )


def lens_data(
    model: PretrainedModel, tokenizer: Any, ids: Tensor, inputs: list[str]
) -> dict | None:
    """The logit lens of a model that reads one text through a vocabulary head (a GPT, an
    encoder LM; None for other models): per stage (the embeddings, then each layer) and
    input position, the three likeliest tokens and their probabilities."""
    if getattr(model, "kind", None) == "seq2seq" or not inputs:
        return None
    try:
        if readout(model).vocabulary is None:  # a class head: no tokens to show
            return None
    except TypeError:
        return None
    top, probs = logit_lens(model, ids[:1]).top(3)  # (S, T, 3)
    return {
        "stages": [f"layer {i}" if i else "embeddings" for i in range(top.size(0))],
        "inputs": inputs,
        "tokens": [[token_labels(tokenizer, cell) for cell in row] for row in top.tolist()],
        "probs": [[[round(p, 5) for p in cell] for cell in row] for row in probs.tolist()],
    }


def _lengths(labels: dict[str, list[str]]) -> dict[str, tuple[int, int]]:
    """(queries, keys) per kind of attention."""
    if "source" in labels:
        s, t = len(labels["source"]), len(labels["target"])
        return {"encoder": (s, s), "decoder": (t, t), "cross": (t, s)}
    n = len(labels["input"])
    return {k: (n, n) for k in TITLES}


def base64_floats(t: Tensor) -> str:
    """A tensor as base64 of its float32 values, little-endian, in row-major order."""
    return base64.b64encode(
        t.detach().float().contiguous().numpy().astype("<f4").tobytes()
    ).decode()


def base64_halves(t: Tensor) -> str:
    """A tensor as base64 of its float16 values, little-endian, in row-major order."""
    return base64.b64encode(t.detach().half().contiguous().numpy().astype("<f2").tobytes()).decode()


def render_page(data: dict[str, Any]) -> str:
    """The viewer: ``html/viewer.html`` in the page, with its style, data and scripts."""
    return render("viewer.html", ("viewer.css",), SCRIPTS, data,
                  title="glassformer attention", data_id="attention-data")  # fmt: skip
