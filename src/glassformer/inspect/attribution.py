"""Attribution patching: every activation patch estimated from one backward pass.

Activation patching runs the corrupted input once per place, with that place's clean value
put back. Attribution patching estimates all of them at once, to first order: the metric
M of the corrupted run moves, when the activation a is patched from a_corrupt to a_clean, by

    M(corrupt, a ← a_clean) − M(corrupt) ≈ (a_clean − a_corrupt) · ∂M/∂a |corrupt

a dot product over the activation's features, with the gradient taken on the corrupted run
(the "denoising" direction of Nanda's write-up and TransformerLens). Two forward passes
and one backward pass give the estimate for every layer, position and head.

- ``attribution_patching``: the estimate for the places ``activation_patching`` patches
  (the residual stream at every layer × position, attention and MLP outputs, each head);
  it returns what ``activation_patching`` returns, the metric of each patched run, so the
  two can be compared number for number.
- ``edge_attribution_patching``: the estimate per edge between components (Syed, Rager
  and Conmy, 2023). A component's output reaches a later one's input through the residual
  stream; the edge u → v is scored (Δ output of u) · ∂M/∂(input of v), where "input of v"
  is the stream as v alone reads it: head h's query (or key, or value) input, an MLP's input,
  the final readout. The gradients through one reader alone are vector-Jacobian products
  from that reader's own q/k/v (or MLP output) back to the stream it reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from glassformer.inspect.edges import EdgeGraph
from glassformer.inspect.patching import (
    PATCHABLE,
    Inputs,
    Metric,
    _logits,
    check_pair,
    metric_tensor,
    per_layer,
)
from glassformer.models.base import PretrainedModel

# the residual stream's places, beside the outputs activation_patching patches
PLACES = {**PATCHABLE, "resid_mid": "hook_resid_mid", "resid_post": "hook_resid_post"}


def gradient_run(
    model: PretrainedModel,
    inputs: tuple[Tensor, ...],
    metric: Metric,
    names: list[str],
    **forward: Any,
) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
    """One run of ``inputs`` keeping the values at ``names`` live (differentiable, the pass
    built on them): (metric, live values, their gradients ``<name>_grad``). The graph is
    kept, for further products with it (``run_with_cache(detach=False, grads=)``)."""
    score = metric_tensor(metric)
    output, cache = model.run_with_cache(
        *inputs, names=names, detach=False, grads=lambda out: score(_logits(out)), **forward
    )
    live = {name: cache[name] for name in names}
    grads = {f"{name}_grad": cache[f"{name}_grad"] for name in names}
    return score(_logits(output)).detach(), live, grads


def attribution_patching(
    model: PretrainedModel,
    clean: Inputs,
    corrupt: Inputs,
    metric: Metric,
    *,
    what: str = "resid_pre",
    stack: str | None = None,
) -> Tensor:
    """The metric of the corrupted run with one clean activation patched in, for each place,
    estimated to first order from one backward pass (see the module's docstring): the same
    places and shapes as ``activation_patching``, and its numbers where the model is linear
    in the patched activation.

    Args:
        model: any glassformer model with blocks.
        clean: one example's inputs: ids (1, T), an image, or a translator's (source,
            target) pair.
        corrupt: the same shapes, changed.
        metric: the model's logits → a 0-d tensor (``logit_difference``), differentiable.
        what: ``"resid_pre"``, ``"resid_mid"``, ``"resid_post"``, ``"attn_out"``,
            ``"mlp_out"`` (each layer × position: (L, T)) or ``"z"`` (each layer × head, all
            positions: (L, H)).
        stack: whose blocks: None for a one-stack model's own, "encoder" or "decoder" for a
            translator's.
    """
    clean, corrupt = check_pair(clean, corrupt)
    if what not in PLACES:
        raise ValueError(f"what must be one of {', '.join(PLACES)}, got {what!r}")
    names = per_layer(model, PLACES[what], stack)
    with torch.no_grad():
        _, cache = model.run_with_cache(*clean, names=names)
    base, live, grads = gradient_run(model, corrupt, metric, names)
    rows = []
    for name in names:
        change = (cache[name] - live[name].detach()) * grads[f"{name}_grad"]  # (1, T, ...)
        if what == "z":
            rows.append(change[0].sum(dim=(0, 2)))  # (H,): a head at every position
        else:
            rows.append(change[0].flatten(1).sum(1))  # (T,)
    return base + torch.stack(rows)


# ---- edges --------------------------------------------------------------------------------


@dataclass(frozen=True)
class EdgeAttribution:
    """Edge attribution patching of one clean/corrupted pair.

    ``scores[w, r, t]`` estimates how the metric moves when what writer ``writers[w]`` adds
    to the stream at position t is patched to its clean value *as reader ``readers[r]``
    sees it*, nothing else changed; zero where w comes after r (``edges[w, r]`` is False).
    Writers: ``"embed"``, ``"L{layer}.H{h}"`` (a head's output), ``"L{layer}.mlp"``; readers:
    ``"L{layer}.H{h}.q"`` (``.k``, ``.v``: the key and value heads under grouped-query
    attention), ``"L{layer}.mlp"``, ``"logits"`` (layers counted from 0). ``metric`` is the
    corrupted run's value; ``node_scores`` sums each writer's edges over readers and
    positions: its node attribution (the change when its whole output is patched)."""

    writers: list[str]
    readers: list[str]
    scores: Tensor  # (W, R, T)
    edges: Tensor  # (W, R) bool
    metric: float

    @property
    def node_scores(self) -> Tensor:
        return self.scores.sum(dim=(1, 2))

    def top(self, k: int = 10) -> list[tuple[str, str, float]]:
        """The k edges whose estimate is largest in size, summed over positions."""
        total = self.scores.sum(2)
        order = total.abs().flatten().argsort(descending=True)[:k]
        return [
            (self.writers[w], self.readers[r], float(total[w, r]))
            for w, r in (divmod(int(i), total.size(1)) for i in order)
            if self.edges[w, r]
        ]


def edge_attribution_patching(
    model: PretrainedModel,
    clean: Inputs,
    corrupt: Inputs,
    metric: Metric,
    *,
    ig_steps: int = 1,
    ig_over: str = "inputs",
    stack: str | None = None,
) -> EdgeAttribution:
    """Every edge's attribution (``EdgeAttribution``): two forward passes, one backward pass
    and one batched vector-Jacobian product per block.

    ``ig_steps=N > 1`` is EAP-IG (Hanna, Pezzelle and Belinkov, 2024): the gradient at each
    reader is averaged over N points of a path from the corrupted run to the clean one,
    α = 0, 1/N, ..., (N−1)/N (α = 0 is the corrupted run: one step is plain EAP):

    - ``ig_over="inputs"``: the stream entering the first block (token and position
      embeddings) moves from the corrupted input's to the clean input's; N passes.
    - ``ig_over="activations"``: each writer's own output moves, one sub-layer at a time,
      and its edges take the gradients of its own path; 1 + (2L + 1)(N − 1) passes.

    ``clean`` and ``corrupt`` may be a batch of pairs (N, T) of equal length; the metric then
    sees the batch's logits and gives one number (their mean, say), and the scores are
    that number's. Needs a residual stream that is the sum of what the components write:
    pre-norm blocks, sequential or parallel, without a norm on a sub-layer's output.
    Post-norm and "sandwich"-norm blocks are refused in one line.
    """
    clean, corrupt = check_batch(clean, corrupt)
    return edge_scores(model, clean, corrupt, metric, ig_steps=ig_steps, ig_over=ig_over,
                       stack=stack)[0]  # fmt: skip


def edge_scores(
    model: PretrainedModel,
    clean: tuple[Tensor, ...],
    corrupt: tuple[Tensor, ...],
    metric: Metric,
    *,
    ig_steps: int,
    ig_over: str = "inputs",
    stack: str | None = None,
    forward: dict[str, Any] | None = None,
) -> tuple[EdgeAttribution, EdgeAttribution]:
    """(EAP-IG's scores, EAP's): the first step of the path is the corrupted run, whose
    gradients are plain EAP's, so both come from one pass over the path. ``forward``: more
    arguments of the model's forward (``logits_to_keep=1`` where the metric reads the last
    position only)."""
    if not isinstance(ig_steps, int) or ig_steps < 1:
        raise ValueError(f"ig_steps must be a positive integer, got {ig_steps!r}")
    if ig_over not in IG_OVER:
        raise ValueError(f"ig_over must be one of {', '.join(IG_OVER)}, got {ig_over!r}")
    forward = forward or {}
    graph = EdgeGraph(model, stack)
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(*clean, names=graph.writer_names, **forward)
    graph.check_additive(clean_cache)
    base, live, grads = gradient_run(model, corrupt, metric, graph.names(), **forward)
    deltas = graph.writes(clean_cache) - graph.writes(live).detach()  # (W, B, T, D)
    first = graph.reader_gradients(live, grads)  # (R, B, T, D)
    embed = graph.at(0, "hook_resid_pre")  # the stream entering the first block
    ends = clean_cache[embed], live[embed].detach()
    del live, grads
    eap = torch.einsum("wbtd,rbtd->wrt", deltas, first)
    if ig_steps == 1:
        scores = eap
    elif ig_over == "inputs":
        reads = first.clone()
        for k in range(1, ig_steps):
            at = ends[1] + (k / ig_steps) * (ends[0] - ends[1])
            reads += _reads_along(model, graph, corrupt, metric, [(embed, at)], forward)
        scores = torch.einsum("wbtd,rbtd->wrt", deltas, reads / ig_steps)
    else:
        scores = _activations_path(model, graph, (clean, corrupt), metric, ig_steps, deltas,
                                   first, forward)  # fmt: skip
    edges = graph.edges
    return tuple(  # type: ignore[return-value]
        EdgeAttribution(graph.writers, graph.readers, x * edges[:, :, None], edges, float(base))
        for x in (scores, eap)
    )


IG_OVER = ("inputs", "activations")


def check_batch(clean: Inputs, corrupt: Inputs) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """A pair, or a batch of pairs: ids (N, T) stay a batch; one example as ``check_pair``."""
    ids = isinstance(clean, Tensor) and isinstance(corrupt, Tensor) and clean.dim() == 2
    if ids and not clean.is_floating_point() and clean.shape == corrupt.shape:  # type: ignore[union-attr]
        return (clean,), (corrupt,)  # type: ignore[return-value]
    return check_pair(clean, corrupt)


def _reads_along(
    model: PretrainedModel,
    graph: EdgeGraph,
    inputs: tuple[Tensor, ...],
    metric: Metric,
    held: list[tuple[str, Tensor]],
    forward: dict[str, Any],
) -> Tensor:
    """The readers' gradients, (R, B, T, D), of a run of ``inputs`` with the values at the
    ``held`` hook points replaced."""
    hooks = [(name, lambda value, _, v=value: v) for name, value in held]
    with model.hooks(hooks):
        _, live, grads = gradient_run(model, inputs, metric, graph.names(), **forward)
    return graph.reader_gradients(live, grads)


def _activations_path(
    model: PretrainedModel,
    graph: EdgeGraph,
    pair: tuple[tuple[Tensor, ...], tuple[Tensor, ...]],
    metric: Metric,
    steps: int,
    deltas: Tensor,
    first: Tensor,
    forward: dict[str, Any],
) -> Tensor:
    """EAP-IG over activations: for each sub-layer (the embeddings, each block's attention,
    each block's MLP), the gradients at the readers averaged over its output's path from
    the corrupted value to the clean, scoring that sub-layer's writers' edges."""
    groups = [(graph.at(0, "hook_resid_pre"), [0])]
    per = graph.heads + 1
    for i in range(graph.layers):
        groups.append((graph.at(i, "hook_attn_out"), list(range(1 + i * per, i * per + per))))
        groups.append((graph.at(i, "hook_mlp_out"), [(i + 1) * per]))
    names = [name for name, _ in groups]
    clean, corrupt = pair
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(*clean, names=names, **forward)
        _, corrupt_cache = model.run_with_cache(*corrupt, names=names, **forward)
    scores = deltas.new_zeros(len(graph.writers), len(graph.readers), deltas.size(2))
    for name, rows in groups:
        reads = first.clone()  # α = 0: the corrupted run, shared by every sub-layer
        ends = clean_cache[name], corrupt_cache[name]
        for k in range(1, steps):
            at = ends[1] + (k / steps) * (ends[0] - ends[1])
            reads += _reads_along(model, graph, corrupt, metric, [(name, at)], forward)
        scores[rows] = torch.einsum("wbtd,rbtd->wrt", deltas[rows], reads / steps)
    return scores
