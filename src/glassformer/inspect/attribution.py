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
    model: PretrainedModel, inputs: tuple[Tensor, ...], metric: Metric, names: list[str]
) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
    """One run of ``inputs`` keeping the values at ``names`` live (differentiable, the pass
    built on them): (metric, live values, their gradients ``<name>_grad``). The graph is
    kept, for further products with it (``run_with_cache(detach=False, grads=)``)."""
    score = metric_tensor(metric)
    output, cache = model.run_with_cache(
        *inputs, names=names, detach=False, grads=lambda out: score(_logits(out))
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
    stack: str | None = None,
) -> EdgeAttribution:
    """Every edge's attribution (``EdgeAttribution``): two forward passes, one backward pass
    and one vector-Jacobian product per reader.

    Needs a residual stream that is the sum of what the components write: pre-norm blocks,
    sequential or parallel, without a norm on a sub-layer's output. Post-norm and
    "sandwich"-norm blocks are refused in one line.
    """
    clean, corrupt = check_pair(clean, corrupt)
    inputs = per_layer(model, "hook_resid_pre", stack)
    graph = _Graph(model, inputs[0].rsplit(".", 2)[0], len(inputs))  # "{stack}.blocks", L
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(*clean, names=graph.writer_names)
    graph.check_additive(clean_cache)
    base, live, grads = gradient_run(model, corrupt, metric, graph.names())
    deltas, writers = graph.writer_deltas(clean_cache, live)  # (W, T, D)
    reads, readers = graph.reader_gradients(live, grads)  # (R, T, D)
    scores = torch.einsum("wtd,rtd->wrt", deltas, reads)
    edges = graph.edge_mask(writers, readers)
    return EdgeAttribution(writers, readers, scores * edges[:, :, None], edges, float(base))


class _Graph:
    """The hook points an edge attribution reads, for ``layers`` blocks named ``block.{l}``."""

    def __init__(self, model: PretrainedModel, block: str, layers: int) -> None:
        self.model, self.block, self.layers = model, block, layers
        known = set(model.hook_names())
        if f"{block}.0.hook_cross_attn_out" in known:
            raise ValueError(
                "edge attribution reads blocks of self-attention and an MLP; a translator's "
                "decoder (cross-attention) is not covered: use attribution_patching"
            )
        self.parallel = f"{block}.0.hook_resid_mid" not in known
        self.mlp_reads = [self._mlp_input(i, known) for i in range(layers)]
        self.writer_names = [  # what the clean run caches: the writes and the sums
            self.at(i, name)
            for i in range(layers)
            for name in (
                "attn.hook_result",
                "hook_mlp_out",
                "hook_attn_out",
                "hook_resid_pre",
                "hook_resid_post",
            )  # fmt: skip
        ]

    def at(self, layer: int, name: str) -> str:
        return f"{self.block}.{layer}.{name}"

    def _mlp_input(self, layer: int, known: set[str]) -> str:
        for name in ("hook_resid_mid_cross", "hook_resid_mid", "hook_resid_pre"):
            if self.at(layer, name) in known:
                return self.at(layer, name)
        raise ValueError(f"block {layer} has no residual stream hook points")

    def names(self) -> list[str]:
        """What the corrupted run keeps live: writers' outputs, readers' inputs and outputs."""
        names = set(self.writer_names) | set(self.mlp_reads)
        for i in range(self.layers):
            names |= {self.at(i, f"attn.hook_{x}") for x in "qkv"}
        return sorted(names)

    def check_additive(self, cache: Any) -> None:
        """The stream must be the sum of the writes: each block's output equals its input plus
        its attention output plus its MLP output (and the heads' results sum to the former)."""
        for i in range(self.layers):
            before, after = (
                cache[self.at(i, "hook_resid_pre")],
                cache[self.at(i, "hook_resid_post")],
            )
            written = cache[self.at(i, "hook_attn_out")] + cache[self.at(i, "hook_mlp_out")]
            heads = cache[self.at(i, "attn.hook_result")].sum(2)
            bias = (
                cache[self.at(i, "hook_attn_out")] - heads
            )  # the output bias, the same everywhere
            scale = after.abs().max().clamp_min(1.0)
            if ((after - before - written).abs().max() > 1e-4 * scale
                    or (bias - bias[:, :1]).abs().max() > 1e-4 * scale):  # fmt: skip
                raise ValueError(
                    f"edge attribution needs a residual stream that is the sum of what each "
                    f"component writes; block {i} normalises after the sum or on a sub-layer's "
                    "output (post-norm, sandwich norms): use attribution_patching for its nodes"
                )

    def writer_deltas(self, clean: Any, live: dict[str, Tensor]) -> tuple[Tensor, list[str]]:
        """(clean − corrupted) of each writer's output at each position: (W, T, D)."""

        def delta(name: str) -> Tensor:
            return (clean[name] - live[name].detach())[0]

        rows, names = [delta(self.at(0, "hook_resid_pre"))], ["embed"]
        for i in range(self.layers):
            heads = delta(self.at(i, "attn.hook_result"))  # (T, H, D)
            rows += list(heads.unbind(1))
            names += [f"L{i}.H{h}" for h in range(heads.size(1))]
            rows.append(delta(self.at(i, "hook_mlp_out")))
            names.append(f"L{i}.mlp")
        return torch.stack(rows), names

    def reader_gradients(
        self, live: dict[str, Tensor], grads: dict[str, Tensor]
    ) -> tuple[Tensor, list[str]]:
        """∂M/∂(the stream as each reader alone reads it), at each position: (R, T, D)."""
        rows: list[Tensor] = []
        names: list[str] = []
        for i in range(self.layers):
            stream = live[self.at(i, "hook_resid_pre")]
            for x in "qkv":
                out = live[self.at(i, f"attn.hook_{x}")]  # (1, T, H, Dh)
                grad = grads[self.at(i, f"attn.hook_{x}") + "_grad"]
                for h in range(out.size(2)):
                    one = torch.zeros_like(grad)
                    one[:, :, h] = grad[:, :, h]
                    rows.append(_vjp(out, stream, one))
                    names.append(f"L{i}.H{h}.{x}")
            mlp = self.at(i, "hook_mlp_out")
            rows.append(_vjp(live[mlp], live[self.mlp_reads[i]], grads[mlp + "_grad"]))
            names.append(f"L{i}.mlp")
        last = self.at(self.layers - 1, "hook_resid_post")
        rows.append(grads[last + "_grad"][0])
        names.append("logits")
        return torch.stack(rows), names

    def edge_mask(self, writers: list[str], readers: list[str]) -> Tensor:
        """True where the writer's output is in the stream the reader reads."""

        def order(name: str) -> float:
            if name in ("embed", "logits"):
                return -1.0 if name == "embed" else float(self.layers)
            layer = float(name.split(".")[0][1:])
            # within a block: attention writes before the (sequential) MLP reads
            return layer + (0.5 if name.endswith("mlp") and not self.parallel else 0.0)

        w = torch.tensor([order(n) for n in writers])
        r = torch.tensor([order(n) for n in readers])
        return w[:, None] < r[None, :]


def _vjp(output: Tensor, stream: Tensor, grad: Tensor) -> Tensor:
    """grad · ∂output/∂stream: the gradient reaching ``stream`` through ``output`` alone."""
    (found,) = torch.autograd.grad(output, stream, grad, retain_graph=True, allow_unused=True)
    return torch.zeros_like(stream[0]) if found is None else found[0]
