"""The explorable forward pass: every step of one real forward pass, with its numbers, its
formula and the line of glassformer's source that computed it, in one offline page.

``explain_html(model, tokenizer, text)`` runs the model once with ``run_with_cache`` and
puts every hook point's value into the page (the first example; a long tensor thinned to
its first ``MAX_ROWS`` rows and ``MAX_COLUMNS`` columns, and said so), each with where it is
("block 2 · self-attention"), what computed it (the trace's line: "Q = x·W_q + b_q, in 4
heads of 8"), and its source: the file and line where the module's ``forward`` passes the
value through that hook point, with the line's text. The page shows the model as a flow
(the embeddings, each block, the output); a click descends into a block, then into one of
its sub-layers' steps, then into one query and key of a head's scores (the products that
make the score). For a language model or a classifier it also holds the output's logits,
and its controls (temperature, top-k, top-p) recompute the distribution in the page.

Nothing is recomputed in Python: every number is the model's own, read at its hook points.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from glassformer.models.base import PAGES
from glassformer.viz.trace import describe

MAX_ROWS, MAX_COLUMNS = 64, 256  # per step: positions (or queries) and features (or keys)
MAX_BYTES = 5_000_000  # the page's limit
TOP_TOKENS = 100  # a language model's output: the labels of the likeliest tokens
PACKAGE = Path(__file__).resolve().parents[1]  # src/glassformer


def explain_html(
    model: Any,
    tokenizer: Any,
    text: str,
    *,
    target: str | None = None,
    labels: list[str] | None = None,
) -> Any:
    """The page for ``model`` on ``text`` (an ``AttentionView``: ``save(path)``, shown inline
    in a notebook; also ``model.explain(tokenizer, text)``). ``labels``: a classifier's class
    names, in the order of its outputs. Refused in one line beyond ``MAX_BYTES``."""
    from glassformer.viz.viewer import EXPLAIN_SCRIPTS, AttentionView, render

    data = explain_data(model, tokenizer, text, target=target)
    if labels is not None and data["output"] and data["output"]["kind"] == "classes":
        data["output"]["labels"] = list(labels)
    page = render("explain.html", ("viewer.css", "explain.css"), EXPLAIN_SCRIPTS, data)
    if len(page.encode()) > MAX_BYTES:
        raise ValueError(
            f"the page would be {len(page.encode()):,} bytes, over the limit of {MAX_BYTES:,}: "
            f"use a shorter text ({len(data['tokens'])} tokens here)"
        )
    return AttentionView(page)


def explain_data(model: Any, tokenizer: Any, text: str, *, target: str | None = None) -> dict:
    """What the page shows, as the JSON-ready dict it embeds."""
    from glassformer.viz.attention import model_inputs
    from glassformer.viz.viewer import base64_floats

    args, kwargs, labels = model_inputs(model, tokenizer, text, target)
    with torch.no_grad():
        output, cache = model.run_with_cache(*args, **kwargs)
    steps = []
    for step in describe(model, cache, values=0):
        value = _first_example(cache[step.name])
        per_head = step.name.rsplit(".", 1)[-1] in PER_HEAD
        if per_head:  # (T, H, Dh) shown as heads × positions × features
            value = value.transpose(0, 1)
        shown = _thinned(value)
        lowest = torch.finfo(shown.dtype).min
        steps.append({
            "name": step.name, "where": step.where, "what": step.what,
            "shape": list(cache[step.name].shape), "shown": list(shown.shape),
            "layout": "heads × positions × features" if per_head else "",
            "values": base64_floats(shown.masked_fill(shown == lowest, -1e30)),
            "source": source_of(model, step.name),
            **_scale(model, step.name),
        })  # fmt: skip
    return {
        "title": f"{model.kind} model: one forward pass",
        "text": text,
        "tokens": labels.get("input") or labels.get("target") or [],
        "steps": steps,
        "output": _output(model, tokenizer, output),
    }


PER_HEAD = ("hook_q", "hook_k", "hook_v", "hook_rot_q", "hook_rot_k", "hook_z", "hook_result")


def _scale(model: Any, name: str) -> dict[str, float]:
    """What q·k is multiplied by in the scores of the attention owning ``name``."""
    if not name.endswith(("hook_attn_scores", "hook_pattern")):
        return {}
    attn = model.get_submodule(name.rpartition(".")[0])
    return {"scale": attn.scale if attn.scale is not None else attn.head_dim**-0.5}


def _first_example(value: Tensor) -> Tensor:
    """The value of the one example: (B, ...) → (...); a position table stays as it is."""
    value = value.detach().float()
    return value[0] if value.dim() >= 2 and value.size(0) == 1 else value


def _thinned(value: Tensor) -> Tensor:
    """At most MAX_ROWS along the second-to-last dimension (positions, queries) and
    MAX_COLUMNS along the last (features, keys)."""
    if value.dim() >= 2:
        value = value[..., :MAX_ROWS, :]
    return value[..., :MAX_COLUMNS].contiguous()


# hook points whose value is computed elsewhere than where the point is named: the module
# (or the owner's class, None) and the line that computes it
COMPUTED = {
    "hook_q": (None, r"return self\._hooked_qkv\("),
    "hook_k": (None, r"return self\._hooked_qkv\("),
    "hook_v": (None, r"return self\._hooked_qkv\("),
    "hook_attn_scores": ("glassformer.modules.sdpa", r"scores = q @ k\.transpose"),
    "hook_pattern": ("glassformer.modules.sdpa", r"weights = scores\.softmax"),
}


def source_of(model: Any, name: str) -> dict[str, Any]:
    """Where the value at hook point ``name`` is computed: the file (under the package), the
    line and its text. That is the line of the owning module's class that passes the value
    through the point (``self.hook_x(...)``), or for q/k/v, the scores and the weights, the
    line that computes them (``COMPUTED``)."""
    import importlib

    owner_name, _, attribute = name.rpartition(".")
    owner = model.get_submodule(owner_name) if owner_name else model
    where, pattern = COMPUTED.get(attribute, (None, rf"self\.{attribute}\b(?!\s*=[^=])"))
    places = (
        [importlib.import_module(where)]
        if where
        else [c for c in type(owner).__mro__ if c.__module__.split(".")[0] == "glassformer"]
    )
    for place in places:
        lines, start = inspect.getsourcelines(place)
        for offset, line in enumerate(lines):
            if re.search(pattern, line):
                file = Path(inspect.getsourcefile(place) or "").resolve()
                return {"file": str(file.relative_to(PACKAGE.parent)),
                        "line": max(start, 1) + offset, "code": line.strip()}  # fmt: skip
    return {"file": "", "line": 0, "code": ""}


def _output(model: Any, tokenizer: Any, output: Any) -> dict | None:
    """The logits of the last position (a language model) or the classes (a classifier),
    with the labels the page shows."""
    from glassformer.viz.attention import token_labels
    from glassformer.viz.viewer import base64_floats

    logits = getattr(output, "logits", None)
    if logits is None:
        return None
    if logits.dim() == 2:  # a classifier: (1, C)
        classes = [str(i) for i in range(logits.size(-1))]
        return {"kind": "classes", "labels": classes, "logits": base64_floats(logits[0])}
    last = logits[0, -1].float()
    top = last.topk(min(TOP_TOKENS, last.numel())).indices.tolist()
    return {"kind": "tokens", "top": top, "labels": token_labels(tokenizer, top),
            "logits": base64_floats(last)}  # fmt: skip


PAGES["explain"] = explain_html
