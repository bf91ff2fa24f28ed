"""Attribution graphs: which features, errors and tokens made a model say what it said.

With transcoders in place of the MLPs and the rest of the model held linear around one
text (``inspect.replacement``), every node's direct effect on every other is exact:

- **nodes**: input tokens (their embeddings), active transcoder features (layer, position,
  feature), one error node per layer and position (what the transcoder missed of the MLP's
  output), and the output logits with the most probability;
- **edge s → t**: how much s's write moves t's read, directly (through the residual stream,
  held attention and held norms, not through other nodes). A feature's write is its
  activation times its decoder row(s); a feature's read is its encoder row dotted with its
  layer's MLP input (its evidence, before the activation); a logit's read is its unembedding
  row minus the vocabulary's mean row, dotted with the final norm's output.

``inspect.tracing.attribution_graph`` computes the graph; here is what it is and what is
done with it. The adjacency, its node order and the pruning and scores are circuit-tracer's
(Anthropic and Decode Research's library), so its tools read the JSON written from it:

    graph = attribution_graph(model, transcoders, ids)
    graph.scores()                   # replacement and completeness (1: no error)
    kept = graph.prune(0.8, 0.98)    # nodes and edges carrying 80% / 98% of the influence

Node order (rows are targets, columns sources): features, errors (layer-major), tokens,
logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor


@dataclass
class AttributionGraph:
    """The direct-effect graph of one text (see the module's docstring).

    Attributes:
        tokens: the text's ids (T,).
        features: (layer, position, feature) of each feature node, (F, 3).
        activations: each feature node's activation (F,).
        logit_tokens: the output tokens with logit nodes (K,), most probable first.
        logit_probabilities: their probabilities (K,).
        adjacency: (N, N), N = F + layers·T + T + K; row = target, column = source.
        layers: how many layers (error nodes per position).
        active_features: how many features were active in all (F may keep fewer).
    """

    tokens: Tensor
    features: Tensor
    activations: Tensor
    logit_tokens: Tensor
    logit_probabilities: Tensor
    adjacency: Tensor
    layers: int
    active_features: int

    @property
    def n_pos(self) -> int:
        return len(self.tokens)

    def node_kinds(self) -> list[str]:
        """Each node's kind in order: "feature", "error", "token", "logit"."""
        t = self.n_pos
        return (["feature"] * len(self.features) + ["error"] * self.layers * t
                + ["token"] * t + ["logit"] * len(self.logit_tokens))  # fmt: skip

    def logit_weights(self) -> Tensor:
        """Each node's weight as an output: the logits' probabilities, zero elsewhere."""
        weights = torch.zeros(len(self.adjacency))
        weights[-len(self.logit_tokens) :] = self.logit_probabilities
        return weights

    def influence(self) -> Tensor:
        """Each node's total influence on the logits: direct and through every path, with
        each node's incoming edges normalised to sum to one in absolute value."""
        return _influence(_normalised(self.adjacency), self.logit_weights())

    def scores(self) -> tuple[float, float]:
        """(replacement, completeness): the share of the tokens' and errors' influence on
        the logits that is the tokens', and the influence-weighted share of every node's
        input that does not come from errors (circuit-tracer's definitions)."""
        f, t = len(self.features), self.n_pos
        errors = slice(f, f + self.layers * t)
        tokens = slice(errors.stop, errors.stop + t)
        normal = _normalised(self.adjacency)
        weights = self.logit_weights()
        influence = _influence(normal, weights)
        token, error = influence[tokens].sum(), influence[errors].sum()
        replacement = token / (token + error)
        not_error = 1 - normal[:, errors].sum(-1)
        output = influence + weights
        completeness = (not_error * output).sum() / output.sum()
        return float(replacement), float(completeness)

    def prune(self, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> Pruned:
        """The nodes carrying ``node_threshold`` of the influence and the edges carrying
        ``edge_threshold`` of what remains; tokens and logits always kept; features and
        errors left without an edge out (or features without one in) dropped, repeatedly."""
        for name, value in (("node_threshold", node_threshold),
                            ("edge_threshold", edge_threshold)):  # fmt: skip
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, got {value}")
        k, t, f = len(self.logit_tokens), self.n_pos, len(self.features)
        weights = self.logit_weights()
        node_influence = _influence(_normalised(self.adjacency), weights)
        nodes = node_influence >= _threshold(node_influence, node_threshold)
        nodes[-k - t :] = True
        kept = self.adjacency.clone()
        kept[~nodes] = 0
        kept[:, ~nodes] = 0
        normal = _normalised(kept)
        edge_scores = normal * (_influence(normal, weights) + weights)[:, None]
        edges = edge_scores >= _threshold(edge_scores.flatten(), edge_threshold)
        before = nodes.clone()
        while True:
            nodes[: -k - t] &= edges[:, : -k - t].any(0)  # an edge out
            nodes[:f] &= edges[:f].any(1)  # a feature: an edge in
            if torch.equal(nodes, before):
                break
            before = nodes.clone()
            edges[~nodes] = False
            edges[:, ~nodes] = False
        order = node_influence.argsort(descending=True)
        cumulative = torch.zeros_like(node_influence)
        cumulative[order] = node_influence[order].cumsum(0) / node_influence.sum()
        return Pruned(nodes, edges, cumulative)


class Pruned(NamedTuple):
    nodes: Tensor  # (N,) bool: kept
    edges: Tensor  # (N, N) bool: kept
    cumulative: Tensor  # (N,) each node's cumulative share of the influence, by rank


def _normalised(adjacency: Tensor) -> Tensor:
    a = adjacency.abs()
    return a / a.sum(1, keepdim=True).clamp(min=1e-10)


def _influence(normal: Tensor, weights: Tensor, max_iter: int = 1000) -> Tensor:
    """weights · (A + A² + A³ + …): A is nilpotent (edges go forward), so the sum ends."""
    step = weights @ normal
    total = step.clone()
    for _ in range(max_iter):
        if not step.any():
            return total
        step = step @ normal
        total += step
    raise RuntimeError(f"influence did not converge in {max_iter} steps: a cycle in the graph")


def _threshold(scores: Tensor, share: float) -> Tensor:
    """The score above which the highest scores make up ``share`` of the total."""
    ordered = scores.sort(descending=True).values
    cumulative = ordered.cumsum(0) / ordered.sum()
    index = min(int(torch.searchsorted(cumulative, share)), len(cumulative) - 1)
    return ordered[index]
