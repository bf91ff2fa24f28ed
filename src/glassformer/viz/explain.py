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

Every number is the model's own, read at its hook points. A step that is one line of
arithmetic from earlier steps (a residual sum, the softmax of the scores, ...) travels as
that line and the page computes it, where the line gives the cache's value
(``glassformer.viz.derive``); a page that would still be over ``MAX_BYTES`` carries float16
values and fewer features a step (``THINNER``), and says so. SmolLM2-135M's page holds up
to 50 tokens (4.5 MB at 40).
"""

from __future__ import annotations

import base64
import functools
import inspect
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from glassformer.models.base import PretrainedModel
from glassformer.viz.attention import attention_module
from glassformer.viz.derive import MASKED, derivations
from glassformer.viz.trace import describe

MAX_ROWS, MAX_COLUMNS = 64, 256  # per step: positions (or queries) and features (or keys)
THINNER = (MAX_COLUMNS, 128, 64, 32)  # features a step, tried in turn with float16 values
MAX_BYTES = 5_000_000  # the page's limit
HALF_RANGE = 60_000  # float16's largest value is 65,504
TOP_TOKENS = 100  # a language model's output: the labels of the likeliest tokens
KEPT_LOGITS = 2_000  # a translator's logits at each target position: the largest kept
PACKAGE = Path(__file__).resolve().parents[1]  # src/glassformer


def explain_html(
    model: PretrainedModel,
    tokenizer: Any,
    text: str,
    *,
    target: str | None = None,
    labels: list[str] | None = None,
) -> Any:
    """The page for ``model`` on ``text`` (an ``AttentionView``: ``save(path)``, shown inline
    in a notebook). ``labels``: a classifier's class names, in the order of its outputs. The
    page carries its tensors as float32; a page that would be over ``MAX_BYTES`` so carries
    them as float16 (about 3 significant digits, and said on the page); one still over is
    refused in one line. (``model.explain(tokenizer, text, live=None)`` makes the live page
    where the model can have one: ``glassformer.viz.live.explain_page``.)"""
    from glassformer.viz.page import render
    from glassformer.viz.viewer import EXPLAIN_SCRIPTS, AttentionView

    forward = _forward(model, tokenizer, text, target)
    collected = None
    for columns, half in ((MAX_COLUMNS, False), *((c, True) for c in THINNER)):
        if collected is None or collected[0] != columns:  # float16 alone keeps the steps
            collected = (columns, *_collect(model, *forward, columns=columns)[:2])
        _, data, shown = collected
        if labels is not None and data["output"] and data["output"]["kind"] == "classes":
            data["output"]["labels"] = _class_names(labels, len(data["output"]["labels"]))
        _carry(data, shown, half=half)  # each step's values (and error) written anew
        page = render("explain.html", ("viewer.css", "explain.css"), EXPLAIN_SCRIPTS, data,
                      title="glassformer: one forward pass", data_id="explain-data")  # fmt: skip
        size = len(page.encode())
        if size <= MAX_BYTES:
            return AttentionView(page)
    raise ValueError(
        f"the page would be {size:,} bytes even with float16 values and "
        f"{THINNER[-1]} features a step, over the limit of {MAX_BYTES:,}: use a shorter text "
        f"({len(data['tokens'])} tokens here)"
    )


def _class_names(labels: list[str], classes: int) -> list[str]:
    """A classifier's ``labels``, one for each of its ``classes`` outputs: any other number
    would leave outputs unnamed on the page (shown as "undefined")."""
    if len(labels) != classes:
        raise ValueError(f"{len(labels)} labels were given for a model of {classes} classes")
    return list(labels)


def explain_data(
    model: PretrainedModel,
    tokenizer: Any,
    text: str,
    *,
    target: str | None = None,
    half: bool = False,
) -> dict:
    """What the page shows, as the JSON-ready dict it embeds: each step carries its values
    (``values``, base64; ``dtype`` "f16" where ``half``) or the rule that computes them from
    earlier steps (``derive``, see ``glassformer.viz.derive``)."""
    data, shown, _ = _collect(model, *_forward(model, tokenizer, text, target), columns=MAX_COLUMNS)
    _carry(data, shown, half=half)
    return data


def _forward(model: PretrainedModel, tokenizer: Any, text: str, target: str | None) -> tuple:
    """One forward pass with every hook point cached: (text, tokenizer, output, cache,
    labels, image)."""
    from glassformer.viz.attention import model_inputs

    args, kwargs, labels = model_inputs(model, tokenizer, text, target)
    with torch.no_grad():
        output, cache = model.run_with_cache(*args, **kwargs)
    return text, tokenizer, output, cache, labels, _image(model, args)


def _collect(
    model: PretrainedModel,
    text: str,
    tokenizer: Any,
    output: Any,
    cache: dict,
    labels: dict,
    image: dict | None,
    *,
    columns: int,
) -> tuple[dict, list, list]:
    """The page's data without the carried steps' values, the values each step shows (at
    most ``columns`` features) and the same values whole."""
    steps, shown, full = [], [], []
    for step in describe(model, cache, values=0):
        value, per_head = laid_out(step.name, cache[step.name])
        full.append(value)
        whole = per_head or step.name.endswith(("hook_attn_scores", "hook_pattern"))
        value = _thinned(value, MAX_COLUMNS if whole else columns)  # heads and keys kept
        shown.append(value)
        steps.append({
            "name": step.name, "where": step.where, "what": step.what,
            "shape": list(cache[step.name].shape), "shown": list(value.shape),
            "layout": "heads × positions × features" if per_head else "",
            "source": source_of(model, step.name), **_scale(model, step.name),
            **_roles(step.name, model.kind == "seq2seq"),
        })  # fmt: skip
    rules, tables = derivations(model, steps, shown, full)
    for i, rule in rules.items():
        steps[i]["derive"] = rule
    data = {
        "title": f"{model.kind} model: one forward pass",
        "text": Path(text).name if image else text,  # an image: its file's name, not its path
        "tokens": labels.get("input") or labels.get("target") or [],
        "labels": labels,
        "image": image,
        "steps": steps,
        "tables": tables,
        "output": _output(model, tokenizer, output),
    }
    return data, shown, full


def _carry(data: dict, shown: list[Tensor], *, half: bool) -> None:
    """Put each carried step's values into ``data``: float32, or float16 where ``half`` and
    the step's values fit float16's range. With ``half``, every step's largest difference
    from the cache's value, as the page finds it (computed steps from the carried values as
    rounded), relative to the step's largest magnitude, goes in as ``error``."""
    from glassformer.viz.derive import compute, tensors
    from glassformer.viz.viewer import base64_floats, base64_halves

    found: list[Tensor] = []
    tables = tensors(data["tables"])
    for step, value in zip(data["steps"], shown, strict=True):
        if "derive" in step:
            found.append(compute(tensors(step["derive"]), found, tables).float())
        else:
            masked = value <= MASKED / 2
            small = half and float(value.abs().masked_fill(masked, 0).max()) < HALF_RANGE
            step["dtype"] = "f16" if small else "f32"
            step["values"] = base64_halves(value) if small else base64_floats(value)
            found.append(value.half().float().masked_fill(masked, MASKED) if small else value)
        if half:
            step["error"] = relative_error(found[-1], value)
    data["precision"] = "f16" if half else "f32"


def relative_error(found: Tensor, value: Tensor) -> float:
    """The largest difference of the unmasked values over the largest magnitude."""
    kept = value > MASKED / 2
    if not kept.any():
        return 0.0
    peak = float(value[kept].abs().max())
    return float((found.double() - value.double())[kept].abs().max()) / max(peak, 1e-30)


HEAD_NORMS = ("q_norm.hook_normalized", "k_norm.hook_normalized")  # QK-norm: per head too
PER_HEAD = ("hook_q", "hook_k", "hook_v", "hook_rot_q", "hook_rot_k", "hook_z", "hook_result")


def laid_out(name: str, value: Tensor) -> tuple[Tensor, bool]:
    """A hook point's value as the page lays it out (the one example, ``_first_example``),
    and whether it is per head: (T, H, Dh) shown as heads × positions × features."""
    value = _first_example(value)
    per_head = name.rsplit(".", 1)[-1] in PER_HEAD or (
        name.endswith(HEAD_NORMS) and value.dim() == 3  # (OLMo 2's spans every head)
    )
    return (value.transpose(0, 1) if per_head else value), per_head


def _scale(model: PretrainedModel, name: str) -> dict[str, float]:
    """What q·k is multiplied by in the scores of the attention owning ``name``."""
    if not name.endswith(("hook_attn_scores", "hook_pattern")):
        return {}
    attn = attention_module(model, name.rpartition(".")[0])
    return {"scale": attn.scale if attn.scale is not None else attn.head_dim**-0.5}


def _first_example(value: Tensor) -> Tensor:
    """The value of the one example, in float32, a masked score (its dtype's lowest value)
    as ``MASKED``: (B, ...) → (...); a position table stays as it is."""
    value = value.detach()
    if value.is_floating_point():
        value = value.float().masked_fill(value == torch.finfo(value.dtype).min, MASKED)
    return value[0] if value.dim() >= 2 and value.size(0) == 1 else value


def _thinned(value: Tensor, columns: int) -> Tensor:
    """At most MAX_ROWS along the second-to-last dimension (positions, queries) and
    ``columns`` along the last (features, keys)."""
    if value.dim() >= 2:
        value = value[..., :MAX_ROWS, :]
    return value[..., :columns].contiguous()


# hook points whose value is computed elsewhere than where the point is named: the module
# (or the owner's class, None) and the line that computes it
COMPUTED = {
    "hook_q": (None, r"return self\._hooked_qkv\("),
    "hook_k": (None, r"return self\._hooked_qkv\("),
    "hook_v": (None, r"return self\._hooked_qkv\("),
    "hook_attn_scores": ("glassformer.modules.sdpa", r"scores = q @ k\.transpose"),
    "hook_pattern": ("glassformer.modules.sdpa", r"weights = scores\.softmax"),
    "hook_out": ("glassformer.modules.experts", r"y = expert\.hook_out\("),  # run by the MoE
    "shared_expert.hook_out": ("glassformer.modules.experts", r"self\.shared_expert\.hook_out\("),
}


def source_of(model: PretrainedModel, name: str) -> dict[str, Any]:
    """Where the value at hook point ``name`` is computed: the file (under the package), the
    line and its text. That is the line of the owning module's class that passes the value
    through the point (``self.hook_x(...)``), or for q/k/v, the scores and the weights, the
    line that computes them (``COMPUTED``)."""
    owner_name, _, attribute = name.rpartition(".")
    owner = model.get_submodule(owner_name) if owner_name else model
    named = f"{owner_name.rpartition('.')[2]}.{attribute}"  # a part's own: "shared_expert.hook_out"
    return dict(_source(type(owner), named if named in COMPUTED else attribute))  # type: ignore[arg-type]


@functools.cache
def _source(owner: type, attribute: str) -> tuple[tuple[str, Any], ...]:
    import importlib

    where, pattern = COMPUTED.get(attribute, (None, rf"self\.{attribute}\b(?!\s*=[^=])"))
    places = (
        [importlib.import_module(where)]
        if where
        else [c for c in owner.__mro__ if c.__module__.split(".")[0] == "glassformer"]
    )
    for place in places:
        lines, start = inspect.getsourcelines(place)
        for offset, line in enumerate(lines):
            if re.search(pattern, line):
                file = Path(inspect.getsourcefile(place) or "").resolve()
                return (("file", str(file.relative_to(PACKAGE.parent))),
                        ("line", max(start, 1) + offset), ("code", line.strip()))  # fmt: skip
    return (("file", ""), ("line", 0), ("code", ""))


def _output(model: PretrainedModel, tokenizer: Any, output: Any) -> dict | None:
    """What the page's output panel recomputes: a classifier's class logits; a language
    model's next-token logits after the last position; a translator's after every target
    position (the translation step by step), each cut to its ``KEPT_LOGITS`` largest where
    the vocabulary is larger (``ids`` names them); with the labels of the likeliest."""
    from glassformer.viz.attention import token_labels
    from glassformer.viz.viewer import base64_floats

    logits = getattr(output, "logits", None)
    if logits is None:
        return None
    if logits.dim() == 2:  # a classifier: (1, C)
        classes = [str(i) for i in range(logits.size(-1))]
        return {"kind": "classes", "labels": classes, "logits": base64_floats(logits[0])}
    every = model.kind == "seq2seq"
    positions = []
    for t in range(logits.size(1)) if every else [logits.size(1) - 1]:
        row = logits[0, t].float()
        top = row.topk(min(TOP_TOKENS, row.numel())).indices.tolist()
        position = {"after": t, "top": top, "labels": token_labels(tokenizer, top)}
        if every and row.numel() > KEPT_LOGITS:
            kept = row.topk(KEPT_LOGITS).indices.sort().values
            position.update(ids=kept.tolist(), logits=base64_floats(row[kept]))
        else:
            position["logits"] = base64_floats(row)
        positions.append(position)
    kind = "translation" if every else "tokens"
    return {"kind": kind, "vocab": logits.size(-1), "positions": positions}


def _roles(name: str, translator: bool) -> dict[str, str]:
    """Whose positions a step's rows are, and an attention map's columns (its keys): the
    input's; a translator's encoder and the keys and values its decoder's cross-attention
    reads are the source's, the rest of its decoder the target's."""
    if not translator:
        return {"rows": "input", "cols": "input"}
    own = "source" if name.startswith("encoder.") else "target"
    cross = ".cross_attn." in name
    rows = "source" if cross and name.endswith(("hook_k", "hook_v")) else own
    return {"rows": rows, "cols": "source" if cross else own}


def _image(model: PretrainedModel, args: tuple) -> dict | None:
    """A ViT's input as the model sees it (resized, each channel stretched to 0–255), as a
    PNG data URL, with its grid of patches."""
    if model.kind != "vit":
        return None
    import io

    from PIL import Image

    pixels = args[0][0].float()  # (C, H, W)
    low = pixels.amin(dim=(1, 2), keepdim=True)
    high = pixels.amax(dim=(1, 2), keepdim=True)
    pixels = ((pixels - low) / (high - low).clamp_min(1e-12) * 255).round().byte()
    array = pixels.permute(1, 2, 0).numpy()
    image = Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    rows, cols = model.config.grid
    return {"png": "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode(),
            "rows": rows, "cols": cols}  # fmt: skip
