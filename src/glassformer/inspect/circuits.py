"""Circuits: the edges a task needs, and how much of the task they keep.

A circuit is a set of edges between the model's components (``EdgeGraph``: the
embeddings, heads and MLPs that write to the residual stream; the heads' q/k/v, the MLPs and
the logits that read it). ``evaluate_circuit`` runs the clean input with every edge *not*
in the circuit carrying the corrupted run's write instead (the reader sees clean writes
only through circuit edges). The full circuit gives the clean metric, the empty one the
corrupted metric, and the share of the way between them a circuit recovers is its
faithfulness (MIB, Mueller et al. 2025):

    f(C) = (m(C) − m(∅)) / (m(full) − m(∅))

``faithfulness`` evaluates the circuits of the top-scoring edges at MIB's ten sizes, 0.1%
to 100% of the edges, and integrates the curve: CPR, the area under f (circuits of the
highest signed scores; higher is better), and CMD, the area under |1 − f| (circuits of the
largest |scores|; lower is better), as MIB's trapezoids over the fraction of edges.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from glassformer.inspect.attribution import EdgeAttribution, check_batch, edge_scores
from glassformer.inspect.edges import EdgeGraph
from glassformer.inspect.patching import Inputs, Metric, _logits
from glassformer.inspect.tasks import Pairs
from glassformer.models.base import PretrainedModel

MIB_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


@dataclass(frozen=True)
class Circuit:
    """Edges ``edges[w, r]`` (bool) of a model's writers and readers (the names of
    ``EdgeAttribution``). Built from scores: ``Circuit.top(scores, n)`` or
    ``Circuit.greedy(scores, n)``; ``full(…)`` and ``empty(…)`` are the two ends."""

    writers: list[str]
    readers: list[str]
    edges: Tensor  # (W, R) bool
    real: Tensor = field(repr=False)  # (W, R) bool: the edges the model has

    def __len__(self) -> int:
        return int(self.edges.sum())

    @classmethod
    def full(cls, scores: EdgeAttribution) -> Circuit:
        return cls(scores.writers, scores.readers, scores.edges.clone(), scores.edges)

    @classmethod
    def empty(cls, scores: EdgeAttribution) -> Circuit:
        return cls(scores.writers, scores.readers, torch.zeros_like(scores.edges), scores.edges)

    @classmethod
    def top(cls, scores: EdgeAttribution, n: int, *, absolute: bool = True) -> Circuit:
        """The n edges of the highest scores (summed over positions), by size or signed."""
        ranked = _ranking(scores, absolute)
        chosen = torch.zeros(scores.edges.numel(), dtype=torch.bool)
        chosen[ranked.argsort(descending=True, stable=True)[: _size(n, scores)]] = True
        return cls(scores.writers, scores.readers, chosen.view_as(scores.edges), scores.edges)

    @classmethod
    def greedy(cls, scores: EdgeAttribution, n: int, *, absolute: bool = True) -> Circuit:
        """n edges grown back from the logits: each step adds the best-scoring edge into a
        component already in the circuit, so every edge leads to the logits."""
        ranked = _ranking(scores, absolute).view_as(scores.edges)
        reader_of = {name: _node(name) for name in scores.readers}
        by_node: dict[str, list[int]] = {}
        for r, name in enumerate(scores.readers):
            by_node.setdefault(reader_of[name], []).append(r)
        chosen = torch.zeros_like(scores.edges)
        frontier: list[tuple[float, int, int]] = []
        reached: set[str] = set()

        def reach(node: str) -> None:
            if node in reached:
                return
            reached.add(node)
            for r in by_node.get(node, []):
                for w in scores.edges[:, r].nonzero().flatten().tolist():
                    heapq.heappush(frontier, (-float(ranked[w, r]), w, r))

        reach("logits")
        for _ in range(_size(n, scores)):
            if not frontier:
                break
            _, w, r = heapq.heappop(frontier)
            chosen[w, r] = True
            reach(scores.writers[w])
        return cls(scores.writers, scores.readers, chosen, scores.edges)

    def pruned(self) -> Circuit:
        """Without the edges that change nothing: those from a component no circuit path
        reaches from the embeddings, or into one with no circuit path on to the logits."""
        writer_node = [_node(n) for n in self.writers]
        reader_node = [_node(n) for n in self.readers]
        pairs = self.edges.nonzero().tolist()
        forward = {"embed"}
        for w, r in sorted(pairs, key=lambda p: _order(writer_node[p[0]])):
            if writer_node[w] in forward:
                forward.add(reader_node[r])
        backward = {"logits"}
        for w, r in sorted(pairs, key=lambda p: -_order(reader_node[p[1]])):
            if reader_node[r] in backward:
                backward.add(writer_node[w])
        kept = self.edges.clone()
        for w, r in pairs:
            kept[w, r] = writer_node[w] in forward and reader_node[r] in backward
        return Circuit(self.writers, self.readers, kept, self.real)

    @property
    def nodes(self) -> list[str]:
        """The components the circuit's edges touch ("embed", "L3.H2", "L3.mlp", "logits")."""
        found = set()
        for w, r in self.edges.nonzero().tolist():
            found |= {_node(self.writers[w]), _node(self.readers[r])}
        return sorted(found, key=_order)


def _node(name: str) -> str:
    """The component a writer or reader belongs to: "L3.H2.q" → "L3.H2"."""
    return name if name.count(".") < 2 else name.rsplit(".", 1)[0]


def _order(node: str) -> float:
    if node in ("embed", "logits"):
        return -1.0 if node == "embed" else 1e9
    layer, part = node.split(".", 1)
    return int(layer[1:]) + (0.5 if part == "mlp" else 0.0)


def _ranking(scores: EdgeAttribution, absolute: bool) -> Tensor:
    total = scores.scores.sum(2)
    ranked = total.abs() if absolute else total
    return ranked.masked_fill(~scores.edges, float("-inf")).flatten()


def _size(n: int, scores: EdgeAttribution) -> int:
    real = int(scores.edges.sum())
    if not isinstance(n, int) or not 0 <= n <= real:
        raise ValueError(f"a circuit's size must be an integer from 0 to {real} edges, got {n!r}")
    return n


@torch.no_grad()
def evaluate_circuit(
    model: PretrainedModel,
    circuit: Circuit,
    clean: Inputs,
    corrupt: Inputs,
    metric: Metric,
    *,
    stack: str | None = None,
) -> float:
    """The metric of the clean run in which every edge outside ``circuit`` carries the
    corrupted run's write (see the module's docstring). ``clean`` and ``corrupt``: one
    pair, or a batch of pairs (N, T) with a metric of the batch's logits."""
    clean, corrupt = check_batch(clean, corrupt)
    graph = EdgeGraph(model, stack)
    if circuit.writers != graph.writers or circuit.readers != graph.readers:
        raise ValueError("the circuit's edges are another model's: score this model's edges")
    _, theirs = model.run_with_cache(*corrupt, names=graph.split_names())
    outside = graph.edges & ~circuit.edges
    output = model.run_with_hooks(*clean, hooks=graph.split_reads(outside, theirs))
    return float(metric(_logits(output)))


# ---- a task's pairs ------------------------------------------------------------------------


def circuit_scores(
    model: PretrainedModel,
    pairs: Pairs,
    *,
    ig_steps: int = 5,
    ig_over: str = "inputs",
    batch_size: int = 16,
    stack: str | None = None,
) -> EdgeAttribution:
    """Every edge's score for a task: EAP-IG (``edge_attribution_patching``) of the mean of
    the pairs' metric, batch by batch, summed over positions (``scores`` (W, R, 1))."""
    return scores_with_eap(model, pairs, ig_steps=ig_steps, ig_over=ig_over,
                           batch_size=batch_size, stack=stack)[0]  # fmt: skip


def scores_with_eap(
    model: PretrainedModel,
    pairs: Pairs,
    *,
    ig_steps: int = 5,
    ig_over: str = "inputs",
    batch_size: int = 16,
    stack: str | None = None,
) -> tuple[EdgeAttribution, EdgeAttribution]:
    """``circuit_scores`` and plain EAP's scores, which are its first step."""
    totals: list[Tensor] = []
    base = 0.0
    for rows, clean, corrupt in pairs.batches(batch_size):
        metric = pairs.metric(rows, len(pairs))
        parts = edge_scores(model, (clean,), (corrupt,), metric, ig_steps=ig_steps,
                            ig_over=ig_over, stack=stack, forward=last_only(model))  # fmt: skip
        summed = [part.scores.sum(2, keepdim=True) for part in parts]
        totals = summed if not totals else [a + b for a, b in zip(totals, summed, strict=True)]
        base += parts[0].metric
    first = parts[0]
    return tuple(  # type: ignore[return-value]
        EdgeAttribution(first.writers, first.readers, total, first.edges, base) for total in totals
    )


def last_only(model: PretrainedModel) -> dict[str, Any]:
    """The forward's argument that keeps the last position's logits only, where it has one
    (a GPT: the vocabulary head is a fifth of SmolLM2's forward)."""
    return {"logits_to_keep": 1} if getattr(model, "kind", None) == "gpt" else {}


class CircuitRuns:
    """A task's pairs, ready to evaluate circuit after circuit: the corrupted runs' values
    that edges outside a circuit carry are computed once. Calling it with a circuit gives
    the mean of the pairs' metric."""

    def __init__(self, model: PretrainedModel, pairs: Pairs, *, batch_size: int = 16,
                 stack: str | None = None) -> None:  # fmt: skip
        self.model, self.pairs = model, pairs
        self.graph = EdgeGraph(model, stack)
        self.batches = list(pairs.batches(batch_size))
        self.forward = last_only(model)
        self.caches = []
        self.ends: dict[str, float] = {}  # "full" and "empty": the clean and corrupted metrics
        with torch.no_grad():
            for _, _, corrupt in self.batches:
                names = self.graph.split_names()
                self.caches.append(model.run_with_cache(corrupt, names=names, **self.forward)[1])

    @torch.no_grad()
    def __call__(self, circuit: Circuit) -> float:
        if circuit.writers != self.graph.writers or circuit.readers != self.graph.readers:
            raise ValueError("the circuit's edges are another model's: score this model's edges")
        outside = self.graph.edges & ~circuit.edges
        end = "full" if not outside.any() else "empty" if not circuit.edges.any() else None
        if end in self.ends:
            return self.ends[end]
        total = 0.0
        for (rows, clean, _), cache in zip(self.batches, self.caches, strict=True):
            hooks = self.graph.split_reads(outside, cache)
            logits = _logits(self.model.run_with_hooks(clean, hooks=hooks, **self.forward))
            total += float(self.pairs.values(logits, rows).sum())
        value = total / len(self.pairs)
        if end is not None:
            self.ends[end] = value
        return value


@dataclass(frozen=True)
class Faithfulness:
    """Faithfulness at circuit sizes (``fractions`` of the edges: ``sizes`` edges), of the
    top signed scores (``signed``, CPR's circuits) and of the top |scores| (``absolute``,
    CMD's), with the full model's metric (``clean``) and the empty circuit's (``corrupt``)."""

    fractions: tuple[float, ...]
    sizes: tuple[int, ...]
    signed: tuple[float, ...]
    absolute: tuple[float, ...]
    clean: float
    corrupt: float

    @property
    def cpr(self) -> float:
        """Area under the faithfulness of the signed circuits, over the fraction of edges."""
        return _trapezoids(self.fractions, self.signed)

    @property
    def cmd(self) -> float:
        """Area under |1 − faithfulness| of the |score| circuits."""
        return _trapezoids(self.fractions, [abs(1.0 - f) for f in self.absolute])


def _trapezoids(x: tuple[float, ...], y: tuple[float, ...] | list[float]) -> float:
    return sum((x[i + 1] - x[i]) * (y[i] + y[i + 1]) / 2 for i in range(len(x) - 1))


def faithfulness(
    runs: CircuitRuns, scores: EdgeAttribution, fractions: tuple[float, ...] = MIB_FRACTIONS
) -> Faithfulness:
    """The faithfulness curve of ``scores``'s top circuits at ``fractions`` of the edges."""
    if list(fractions) != sorted(fractions) or not all(0 < f <= 1 for f in fractions):
        raise ValueError(f"fractions must rise within (0, 1], got {fractions}")
    clean, corrupt = runs(Circuit.full(scores)), runs(Circuit.empty(scores))
    if clean == corrupt:
        raise ValueError("the clean and corrupted runs give the same metric: nothing to recover")
    real = int(scores.edges.sum())
    sizes = tuple(int(f * real) for f in fractions)
    curves = {
        absolute: tuple(
            (runs(Circuit.top(scores, n, absolute=absolute)) - corrupt) / (clean - corrupt)
            for n in sizes
        )
        for absolute in (False, True)
    }
    return Faithfulness(tuple(fractions), sizes, curves[False], curves[True], clean, corrupt)


def random_scores(scores: EdgeAttribution, seed: int = 0) -> EdgeAttribution:
    """Scores drawn at random (standard normal) for the same edges: the baseline circuits."""
    noise = torch.randn(scores.scores.shape, generator=torch.Generator().manual_seed(seed))
    return EdgeAttribution(scores.writers, scores.readers, noise * scores.edges[:, :, None],
                           scores.edges, scores.metric)  # fmt: skip
