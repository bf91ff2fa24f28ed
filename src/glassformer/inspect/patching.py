"""Interventions: activation patching and head ablation, through the hook points.

Activation patching runs a *corrupted* input with one activation taken from a *clean* run
and measures how much of the clean behaviour comes back: a place whose clean value restores
the answer carries what the answer needs. ``activation_patching`` does it for the residual
stream at every layer × position, or for every attention head (its ``z``, all positions).

    metric = logit_difference(answer_id=tok.encode(" Paris")[0], wrong_id=tok.encode(" Rome")[0])
    effect = activation_patching(model, clean_ids, corrupt_ids, metric)   # (layers, positions)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

Metric = Callable[[Tensor], float]  # the model's logits (1, T, V) -> a number


def logit_difference(answer_id: int, wrong_id: int, position: int = -1) -> Metric:
    """A metric: the answer's logit minus the wrong one's, at ``position``."""

    def metric(logits: Tensor) -> float:
        return float((logits[0, position, answer_id] - logits[0, position, wrong_id]).detach())

    return metric


def _logits(output) -> Tensor:
    return output.logits if hasattr(output, "logits") else output


@torch.no_grad()
def activation_patching(
    model: Any,
    clean: Tensor,
    corrupt: Tensor,
    metric: Metric,
    *,
    what: str = "resid_pre",
    layers_prefix: str = "blocks.layers",
) -> Tensor:
    """The metric of the corrupted run with one clean activation patched in, for each place.

    Args:
        model: a model with hook points (a ``GPT``: its layers under ``blocks.layers``).
        clean, corrupt: two inputs of the same length, (1, T).
        metric: the model's logits → a number (``logit_difference``).
        what: ``"resid_pre"`` (each layer × position of the residual stream entering the
            layer: (L, T)), ``"attn_out"``, ``"mlp_out"`` (the same places of those outputs),
            or ``"z"`` (each layer × head, all positions: (L, H)).
        layers_prefix: where the layers are in the module tree.
    """
    clean, corrupt = clean.view(1, -1), corrupt.view(1, -1)
    if clean.shape != corrupt.shape:
        raise ValueError(
            f"the clean and corrupted inputs must have one length, got {clean.size(1)} "
            f"and {corrupt.size(1)}"
        )
    per_head = what == "z"
    suffix = {"resid_pre": "hook_resid_pre", "attn_out": "hook_attn_out",
              "mlp_out": "hook_mlp_out", "z": "self_attn.hook_z"}.get(what)  # fmt: skip
    if suffix is None:
        raise ValueError(f"what must be resid_pre, attn_out, mlp_out or z, got {what!r}")
    names = _per_layer(model, layers_prefix, suffix)
    _, cache = model.run_with_cache(clean, names=names)
    T = clean.size(1)
    width = cache[names[0]].size(2) if per_head else T
    effect = torch.zeros(len(names), width)
    for layer, name in enumerate(names):
        for i in range(width):

            def patch(value: Tensor, _: str, i: int = i, name: str = name) -> Tensor:
                value = value.clone()
                if per_head:
                    value[:, :, i] = cache[name][:, :, i]  # head i at every position
                else:
                    value[:, i] = cache[name][:, i]
                return value

            effect[layer, i] = metric(_logits(model.run_with_hooks(corrupt, hooks=[(name, patch)])))
    return effect


@torch.no_grad()
def ablate_heads(
    model: Any,
    ids: Tensor,
    heads: Sequence[tuple[int, int]],
    *,
    how: str = "zero",
    layers_prefix: str = "blocks.layers",
):
    """The model's output with the heads ``(layer, head)`` (counting from 0) removed:
    their ``z`` set to zero, or to its mean over the positions (``how="mean"``)."""
    if how not in ("zero", "mean"):
        raise ValueError(f"how must be 'zero' or 'mean', got {how!r}")
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)

    names = _per_layer(model, layers_prefix, "self_attn.hook_z")
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
    return model.run_with_hooks(ids, hooks=[(chosen, ablate)])


def _per_layer(model: Any, prefix: str, suffix: str) -> list[str]:
    """The hook point ``suffix`` of every layer under ``prefix``, in layer order."""
    known = set(model.hook_names())
    names: list[str] = []
    while f"{prefix}.{len(names)}.{suffix}" in known:
        names.append(f"{prefix}.{len(names)}.{suffix}")
    if not names:
        raise ValueError(f"the model has no {prefix}.<layer>.{suffix} hook points")
    return names
