"""Interventions: activation patching and head ablation, through the hook points.

Activation patching runs a *corrupted* input with one activation taken from a *clean* run
and measures how much of the clean behaviour comes back: a place whose clean value restores
the answer carries what the answer needs. ``activation_patching`` does it for the residual
stream at every layer × position, or for every attention head (its ``z``, all positions).

    metric = logit_difference(answer_id=tok.encode(" Paris")[0], wrong_id=tok.encode(" Rome")[0])
    effect = activation_patching(model, clean_ids, corrupt_ids, metric)   # (layers, positions)

Every model kind names its blocks alike (``blocks.{i}``; a translator's ``encoder.blocks.{i}``
and ``decoder.blocks.{i}``), so the same call works on a GPT, a classifier (a metric on its
class logits) or a translator (its inputs a (source, target) pair, ``stack="decoder"``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from glassformer.models.base import PretrainedModel

# the model's logits (1, T, V) or (1, C) -> a number; attribution differentiates it, so there
# a function of yours returns a 0-d tensor (logit_difference's metric has both: see it)
Metric = Callable[[Tensor], Any]
Inputs = Tensor | tuple[Tensor, ...]  # what the model's forward takes, for one example

PATCHABLE = {"resid_pre": "hook_resid_pre", "attn_out": "hook_attn_out",
             "mlp_out": "hook_mlp_out", "z": "attn.hook_z"}  # fmt: skip


def logit_difference(answer_id: int, wrong_id: int, position: int = -1) -> Metric:
    """A metric: the answer's logit minus the wrong one's, at ``position`` (a language
    model's logits (1, T, V)); a classifier's logits (1, C) have one position. Called, it
    gives the number; its ``tensor`` gives the 0-d tensor that attribution differentiates."""

    def tensor(logits: Tensor) -> Tensor:
        last = logits[0] if logits.dim() == 2 else logits[0, position]
        return last[answer_id] - last[wrong_id]

    def metric(logits: Tensor) -> float:
        return float(tensor(logits).detach())

    metric.tensor = tensor  # type: ignore[attr-defined]
    return metric


def metric_tensor(metric: Metric) -> Callable[[Tensor], Tensor]:
    """The metric as a function giving a differentiable 0-d tensor: its ``tensor`` where it
    has one (``logit_difference``), else itself (a function of yours), checked when called."""
    found = getattr(metric, "tensor", metric)

    def checked(logits: Tensor) -> Tensor:
        value = found(logits)
        if not isinstance(value, Tensor):
            raise TypeError(
                f"the metric must return a tensor that depends on the logits (got "
                f"{type(value).__name__}): attribution differentiates it"
            )
        return value

    return checked


def _logits(output: Any) -> Tensor:
    return output.logits if hasattr(output, "logits") else output


def _as_inputs(x: Inputs) -> tuple[Tensor, ...]:
    """One example's inputs as a tuple: ids as (1, T), an image (1, C, H, W) as it is."""
    items = x if isinstance(x, tuple) else (x,)
    return tuple(t if t.is_floating_point() else t.view(1, -1) for t in items)


@torch.no_grad()
def activation_patching(
    model: PretrainedModel,
    clean: Inputs,
    corrupt: Inputs,
    metric: Metric,
    *,
    what: str = "resid_pre",
    stack: str | None = None,
) -> Tensor:
    """The metric of the corrupted run with one clean activation patched in, for each place.

    Args:
        model: any glassformer model.
        clean: the input whose activations are patched in: ids (1, T), or a
            translator's (source, target) pair.
        corrupt: the input that runs, of the same shapes.
        metric: the model's logits → a number (``logit_difference``).
        what: ``"resid_pre"`` (each layer × position of the residual stream entering the
            layer: (L, T)), ``"attn_out"``, ``"mlp_out"`` (the same places of those outputs),
            or ``"z"`` (each layer × head, all positions: (L, H)).
        stack: whose blocks: None for a one-stack model's own, "encoder" or "decoder" for
            a translator's (None means "decoder" there).
    """
    clean, corrupt = check_pair(clean, corrupt)
    if what not in PATCHABLE:
        raise ValueError(f"what must be one of {', '.join(PATCHABLE)}, got {what!r}")
    names = per_layer(model, PATCHABLE[what], stack)
    output, cache = model.run_with_cache(*clean, names=names)
    per_head = what == "z"
    width = cache[names[0]].size(2 if per_head else 1)
    places = [(layer, i) for layer in range(len(names)) for i in range(width)]
    effect = torch.zeros(len(places))
    # the places run side by side, one row of a batch each: a row is the corrupted input with
    # its own place patched; the batch is cut to keep its tokens and logits within bounds
    tokens, logits = corrupt[-1].size(1), _logits(output)[0].numel()
    rows = max(1, min(PATCH_TOKENS // tokens, PATCH_LOGITS // logits))
    for start in range(0, len(places), rows):
        chunk = places[start : start + rows]
        hooks = [(name, _patch_rows(cache[name], chunk, layer, per_head))
                 for layer, name in enumerate(names)
                 if any(at == layer for at, _ in chunk)]  # fmt: skip
        batch = tuple(x.expand(len(chunk), *x.shape[1:]).contiguous() for x in corrupt)
        out = _logits(model.run_with_hooks(*batch, hooks=hooks))
        for r in range(len(chunk)):
            effect[start + r] = float(metric(out[r : r + 1]))
    return effect.view(len(names), width)


PATCH_TOKENS = 4096  # the most tokens one patched batch runs
PATCH_LOGITS = 2**26  # and the most logits it returns (256 MB of float32)


def _patch_rows(clean: Tensor, chunk: list[tuple[int, int]], layer: int, per_head: bool) -> Any:
    """The hook that gives each row of the batch whose place is at ``layer`` the clean value
    there: a head's ``z`` at every position, or the stream at one position."""
    rows = [(r, i) for r, (at, i) in enumerate(chunk) if at == layer]

    def patch(value: Tensor, _: str) -> Tensor:
        value = value.clone()
        for r, i in rows:
            if per_head:
                value[r, :, i] = clean[0, :, i]
            else:
                value[r, i] = clean[0, i]
        return value

    return patch


def check_pair(clean: Inputs, corrupt: Inputs) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """Both inputs as tuples of (1, T) tensors, or one line on why they cannot be a pair."""
    clean, corrupt = _as_inputs(clean), _as_inputs(corrupt)
    if [x.shape for x in clean] != [x.shape for x in corrupt]:
        shapes = [tuple(x.shape) for x in clean], [tuple(x.shape) for x in corrupt]
        raise ValueError(
            f"the clean and corrupted inputs must have the same shapes, got {shapes[0]} "
            f"and {shapes[1]}"
        )
    return clean, corrupt


@torch.no_grad()
def ablate_heads(
    model: PretrainedModel,
    inputs: Inputs,
    heads: Sequence[tuple[int, int]],
    *,
    how: str = "zero",
    stack: str | None = None,
) -> Any:
    """The model's output with the heads ``(layer, head)`` (counting from 0) removed:
    their ``z`` set to zero, or to its mean over the positions (``how="mean"``)."""
    if how not in ("zero", "mean"):
        raise ValueError(f"how must be 'zero' or 'mean', got {how!r}")
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)
    names = per_layer(model, "attn.hook_z", stack)
    for layer in by_layer:
        if not 0 <= layer < len(names):
            raise ValueError(f"layer {layer} does not exist: the model has {len(names)}")

    def ablate(value: Tensor, name: str) -> Tensor:
        layer = names.index(name)
        value = value.clone()  # (B, T, H, Dh)
        for h in by_layer[layer]:
            value[:, :, h] = 0.0 if how == "zero" else value[:, :, h].mean(1, keepdim=True)
        return value

    chosen = [names[layer] for layer in by_layer]
    batch = inputs if isinstance(inputs, tuple) else (inputs,)
    return model.run_with_hooks(*batch, hooks=[(chosen, ablate)])


def per_layer(model: PretrainedModel, suffix: str, stack: str | None = None) -> list[str]:
    """The hook point ``suffix`` of every block of a stack, in layer order:
    ``blocks.{i}.{suffix}``, or a translator's ``{stack}.blocks.{i}.{suffix}``."""
    if stack is None:
        stack = "decoder" if getattr(model, "kind", None) == "seq2seq" else ""
    prefix = f"{stack}.blocks" if stack else "blocks"
    known = set(model.hook_names())
    names: list[str] = []
    while f"{prefix}.{len(names)}.{suffix}" in known:
        names.append(f"{prefix}.{len(names)}.{suffix}")
    if not names:
        raise ValueError(f"the model has no {prefix}.<layer>.{suffix} hook points")
    return names
