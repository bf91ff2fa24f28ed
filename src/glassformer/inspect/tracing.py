"""Computing an attribution graph (``inspect.graph`` says what one is).

One backward pass gives a whole row of the adjacency (one target, every source): inject the
target's read vector as the gradient at its place in the held model
(``inspect.replacement.frozen``) and dot the gradients arriving at each MLP output and at
the embeddings with the sources' writes. A batch of targets goes through at once, one per
copy of the text. With fewer feature nodes kept than are active, features are visited in
order of their influence on the logits through the rows computed so far, as circuit-tracer
visits them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from glassformer.inspect.features import EnoughError
from glassformer.inspect.graph import AttributionGraph
from glassformer.inspect.replacement import frozen
from glassformer.models.gpt import GPT
from glassformer.models.transcoder import Transcoders


def prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """The text's ids after a special first token (BOS where the tokenizer has one, else
    EOS), as circuit-tracer does: the first position, an attention sink, carries no nodes."""
    ids = tokenizer.encode(text)
    if not ids:
        raise ValueError("the text has no tokens")
    bos = getattr(tokenizer, "bos_id", None)
    if bos is None:
        bos = getattr(tokenizer, "eos_id", None)
    return ids if bos is None or ids[0] == bos else [bos, *ids]


def attribution_graph(
    model: GPT,
    transcoders: Transcoders,
    ids: Tensor | str,
    *,
    tokenizer: Any = None,
    max_logits: int = 10,
    logit_probability: float = 0.95,
    max_feature_nodes: int | None = None,
    batch_size: int = 64,
    zero_first: bool = True,
) -> AttributionGraph:
    """The attribution graph of ``model`` on ``ids`` (T,) or (1, T) with ``transcoders``
    (one per block) in place of its MLPs (see the module's docstring).

    Args:
        ids: token ids, or a text (with ``tokenizer``), read after BOS (``prompt_ids``).
        max_logits, logit_probability: logit nodes for the most probable next tokens until
            their probabilities sum to ``logit_probability``, at most ``max_logits``.
        max_feature_nodes: keep at most this many features, the most influential as rows
            are computed (circuit-tracer's order); None keeps every active feature.
        batch_size: rows per backward pass (copies of the text in one batch).
        zero_first: no features or error at position 0 (the first token, an attention
            sink, as the transcoders were trained and as circuit-tracer does).
    """
    ids = _checked(ids, tokenizer, batch_size, max_logits, max_feature_nodes, logit_probability)
    tc = transcoders.unfolded() if transcoders.config.rescale_acts_by_decoder_norm else transcoders
    run = _Setup(model, tc, ids, zero_first)
    logit_ids, probs, logit_vecs = _logit_targets(model, run.last_logits, max_logits,
                                                  logit_probability)  # fmt: skip
    n_feat = len(run.features)
    n_logit = len(logit_ids)
    width = n_feat + (run.n + 1) * run.T  # the sources: features, errors, tokens
    keep = n_feat if max_feature_nodes is None else min(max_feature_nodes, n_feat)
    rows = torch.zeros(keep + n_logit, width + n_logit)
    row_node = torch.zeros(keep + n_logit, dtype=torch.long)
    with _frozen_pass(model, tc, run, batch_size) as live:
        for i in range(0, n_logit, batch_size):
            vecs = logit_vecs[i : i + batch_size]
            targets = [(run.n, run.T - 1, v) for v in vecs]
            rows[i : i + len(vecs), :width] = live.rows(targets)
            row_node[i : i + len(vecs)] = torch.arange(i, i + len(vecs)) + width
        done = n_logit
        visited = torch.zeros(n_feat, dtype=torch.bool)
        while int(visited.sum()) < keep:
            if keep == n_feat:
                pending = torch.arange(n_feat)
            else:
                influence = _partial_influence(rows[:done], probs, row_node[:done])
                rank = influence[:n_feat].argsort(descending=True)
                pending = rank[~visited[rank]][: min(4 * batch_size, keep - int(visited.sum()))]
            for start in range(0, len(pending), batch_size):
                batch = pending[start : start + batch_size]
                targets = [(int(run.features[j, 0]), int(run.features[j, 1]),
                            run.encoders[j]) for j in batch]  # fmt: skip
                rows[done : done + len(batch), :width] = live.rows(targets)
                row_node[done : done + len(batch)] = batch
                visited[batch] = True
                done += len(batch)
    chosen = visited.nonzero().flatten()
    if keep < n_feat:
        rows = rows[:, torch.cat([chosen, torch.arange(n_feat, width + n_logit)])]
    rows = rows[row_node.argsort()]
    size = rows.size(1)
    adjacency = torch.zeros(size, size)
    adjacency[:keep] = rows[:keep]
    adjacency[size - n_logit :] = rows[keep:]
    return AttributionGraph(
        tokens=ids[0].clone(),
        features=run.features[chosen],
        activations=run.activations[chosen],
        logit_tokens=logit_ids,
        logit_probabilities=probs,
        adjacency=adjacency,
        layers=run.n,
        active_features=n_feat,
    )


def _checked(ids: Tensor | str, tokenizer: Any, batch_size: int, max_logits: int,
             max_feature_nodes: int | None, logit_probability: float) -> Tensor:  # fmt: skip
    """The text's ids (1, T), the options checked: one line for each that is out of range."""
    for name, value, least in (("batch_size", batch_size, 1), ("max_logits", max_logits, 1),
                               ("max_feature_nodes", max_feature_nodes or 0, 0)):  # fmt: skip
        if value < least:
            raise ValueError(f"{name} must be at least {least}, got {value}")
    if not 0 < logit_probability <= 1:
        raise ValueError(f"logit_probability must be in (0, 1], got {logit_probability}")
    if isinstance(ids, str):
        if tokenizer is None:
            raise ValueError("a text needs its tokenizer: attribution_graph(..., tokenizer=tok)")
        ids = torch.tensor(prompt_ids(tokenizer, ids))
    if ids.dim() > 2 or (ids.dim() == 2 and ids.size(0) != 1) or ids.numel() == 0:
        raise ValueError(f"one text's ids, (T,) or (1, T), got {tuple(ids.shape)}")
    return ids.reshape(1, -1)


def _partial_influence(rows: Tensor, probs: Tensor, row_node: Tensor) -> Tensor:
    """Each node's influence on the logits through the rows computed so far (the order in
    which circuit-tracer visits features when it keeps fewer than all)."""
    normal = rows.abs()
    normal = normal / normal.sum(1, keepdim=True).clamp(min=1e-8)
    total = torch.zeros(rows.size(1))
    step = torch.zeros(rows.size(1))
    step[-len(probs) :] = probs
    for _ in range(128):
        step = step[row_node] @ normal
        if not step.any():
            return total
        total += step
    raise RuntimeError("influence did not converge in 128 steps")


def _logit_targets(
    model: GPT, logits: Tensor, max_logits: int, share: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The logit nodes: the most probable tokens until their probabilities reach ``share``
    (at most ``max_logits``), their probabilities, and their read vectors (each token's
    unembedding row minus the mean row, in the final norm's output space)."""
    probs = logits.float().softmax(-1)
    top_p, top_i = probs.topk(min(max_logits, len(probs)))
    cut = int(torch.searchsorted(top_p.cumsum(0), share)) + 1
    ids = top_i[:cut]
    unembed = model.lm_head.weight.detach().float()  # (V, D)
    vecs = unembed[ids] - unembed.mean(0)
    if model.project_out is not None:  # OPT-350m: D' → D
        vecs = vecs @ model.project_out.weight.detach().float()
    return ids, probs[ids], vecs


class _Setup:
    """One clean run: every layer's MLP input and output, the active features with their
    encoder rows and writes, the error vectors and the token embeddings."""

    def __init__(self, model: GPT, tc: Transcoders, ids: Tensor, zero_first: bool) -> None:
        config = tc.config
        blocks = len(model.blocks)
        if tuple(config.layers) != tuple(range(blocks)):
            raise ValueError(
                f"an attribution graph needs a transcoder for every block (0 … {blocks - 1}); "
                f"these cover blocks {list(config.layers)}"
            )
        names = [config.hook(i, w) for w in ("input", "output") for i in range(len(config.layers))]
        with torch.no_grad():
            out, cache = model.run_with_cache(ids, names=[*names, "hook_embed"])
        self.ids, self.n, self.T = ids, len(config.layers), ids.size(1)
        x = torch.stack([cache[config.hook(i)][0] for i in range(self.n)]).float()  # (n, T, D)
        y = torch.stack([cache[config.hook(i, "output")][0] for i in range(self.n)]).float()
        with torch.no_grad():
            z = tc.encode(x)  # (n, T, f)
            if zero_first:
                z[:, :1] = 0
            error = y - tc.decode(z, x)
        if zero_first:
            error[:, :1] = 0
        self.last_logits = out.logits[0, -1].detach()
        self.error = error
        self.tokens = cache["hook_embed"][0].float()  # (T, D)
        self.features = z.nonzero()  # (F, 3): layer, position, feature, in that order
        layer, pos, feat = self.features.unbind(1)
        self.activations = z[layer, pos, feat]
        self.encoders = tc.W_enc.detach().float()[layer, feat]  # (F, D)
        # each feature's writes: activation × decoder rows, (F, outputs, D), by source layer
        self.writes: list[tuple[Tensor, Tensor, Tensor]] = []  # (columns, positions, writes)
        for i in range(self.n):
            mine = (layer == i).nonzero().flatten()
            rows = tc.decoder(i).detach().float()[feat[mine]]  # (S, outputs, D)
            self.writes.append((mine, pos[mine], rows * self.activations[mine, None, None]))
        self.skip = tc.config.skip
        self.tc = tc


class _Live:
    """The frozen model's live values on a batch of copies of the text: each layer's MLP
    input (where a feature reads) and output (where writes arrive), the embeddings and the
    final norm's output; ``rows`` computes a batch of adjacency rows from them."""

    def __init__(self, run: _Setup) -> None:
        self.run = run
        self.inputs: dict[int, Tensor] = {}
        self.outputs: dict[int, Tensor] = {}
        self.embed: Tensor | None = None
        self.final: Tensor | None = None

    def hooks(self) -> list[tuple[str, Any]]:
        config = self.run.tc.config

        def embed(value: Tensor, name: str) -> Tensor:
            self.embed = value.detach().requires_grad_()
            return self.embed

        def read(i: int) -> Any:
            def hook(value: Tensor, name: str) -> None:
                self.inputs[i] = value

            return hook

        def write(i: int) -> Any:  # the MLP output: constant, but for the skip term
            def hook(value: Tensor, name: str) -> Tensor:
                if not self.run.skip:
                    self.outputs[i] = value.detach().requires_grad_()
                else:
                    skip = self.inputs[i] @ self.run.tc.W_skip[i].detach().T
                    self.outputs[i] = skip + (value - skip).detach()
                return self.outputs[i]

            return hook

        def final(value: Tensor, name: str) -> None:
            self.final = value
            raise EnoughError

        return [("hook_embed", embed),
                *[(config.hook(i), read(i)) for i in range(self.run.n)],
                *[(config.hook(i, "output"), write(i)) for i in range(self.run.n)],
                ("ln_final.hook_normalized", final)]  # fmt: skip

    def rows(self, targets: list[tuple[int, int, Tensor]]) -> Tensor:
        """Adjacency rows for targets (layer, position, read vector); layer n is the final
        norm's output (a logit). One backward pass: (len(targets), sources)."""
        run = self.run
        assert self.embed is not None and self.final is not None
        batch = self.embed.size(0)
        seeds: dict[int, Tensor] = {}
        for r, (layer, pos, vec) in enumerate(targets):
            seed = seeds.setdefault(layer, torch.zeros_like(self.embed))
            seed[r, pos] += vec
        places = [self.final if layer == run.n else self.inputs[layer] for layer in seeds]
        sources = [self.outputs[i] for i in range(run.n)] + [self.embed]
        grads = torch.autograd.grad(places, sources, grad_outputs=list(seeds.values()),
                                    retain_graph=True, allow_unused=True)  # fmt: skip
        zero = torch.zeros_like(self.embed)
        g = [zero if grad is None else grad.float() for grad in grads]
        n_feat = len(run.features)
        out = torch.zeros(batch, n_feat + (run.n + 1) * run.T)
        for i, (columns, positions, writes) in enumerate(run.writes):
            for o in range(writes.size(1)):  # layer i's features write to layer i + o
                out[:, columns] += torch.einsum("bsd,sd->bs", g[i + o][:, positions],
                                                writes[:, o])  # fmt: skip
        for j in range(run.n):
            start = n_feat + j * run.T
            out[:, start : start + run.T] = torch.einsum("btd,td->bt", g[j], run.error[j])
        start = n_feat + run.n * run.T
        out[:, start:] = torch.einsum("btd,td->bt", g[run.n], run.tokens)
        return out[: len(targets)]


@contextlib.contextmanager
def _frozen_pass(model: GPT, tc: Transcoders, run: _Setup, batch: int) -> Iterator[_Live]:
    """The frozen model run on ``batch`` copies of the text, its live values held."""
    live = _Live(run)
    grads = [p.requires_grad for p in model.parameters()]
    model.requires_grad_(False)
    try:
        with frozen(model, run.ids), torch.enable_grad(), contextlib.suppress(EnoughError):
            model.run_with_hooks(run.ids.expand(batch, -1), hooks=live.hooks())
        yield live
    finally:
        for p, g in zip(model.parameters(), grads, strict=True):
            p.requires_grad_(g)
