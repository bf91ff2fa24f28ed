"""The attribution-graph page: one self-contained HTML file, offline, of a pruned graph.

``graph_html(graph, ...)`` draws the nodes ``graph.prune`` keeps by layer and position
(tokens at the bottom, logits at the top) and its kept edges, each a line as wide as its
weight allows (``edgeWidth`` in ``html/graph.js``: 0.4 px plus up to 4 for the page's
largest weight). Clicking a node shows its top contexts (where the feature fires most in a
bundled corpus: its label, computed offline), its strongest edges in and out, and the
interventions computed when the page was written (the page cannot run the model); several
nodes shift-clicked make a supernode, whose edges in and out are summed.

The viewer's conventions hold: the data is JSON in a ``<script type="application/json">``
element, the script and style are package files inlined under a Content-Security-Policy
that allows no request, and every token and label enters the page as text.
"""

from __future__ import annotations

import math
from typing import Any

from glassformer.inspect.graph import AttributionGraph
from glassformer.viz.page import render
from glassformer.viz.viewer import AttentionView

SCRIPTS = ("helpers.js", "graph.js")
MAX_EDGES = 6_000  # the strongest kept edges drawn at most (a drawing one can read)


def node_ids(graph: AttributionGraph) -> list[str]:
    """Every node's id, circuit-tracer's: ``{layer}_{feature}_{pos}`` for a feature,
    ``0_{layer}_{pos}`` for an error, ``E_{token}_{pos}`` for a token and
    ``{layers + 1}_{token}_{pos}`` for a logit."""
    t, layers = graph.n_pos, graph.layers
    ids = [f"{layer}_{feature}_{pos}" for layer, pos, feature in graph.features.tolist()]
    ids += [f"0_{layer}_{pos}" for layer in range(layers) for pos in range(t)]
    ids += [f"E_{int(token)}_{pos}" for pos, token in enumerate(graph.tokens.tolist())]
    ids += [f"{layers + 1}_{int(token)}_{t - 1}" for token in graph.logit_tokens.tolist()]
    return ids


def graph_data(
    graph: AttributionGraph,
    *,
    tokens: list[str],
    logit_strings: list[str],
    prompt: str,
    contexts: dict[int, list[tuple[str, str, str, float]]] | None = None,
    interventions: list[dict[str, Any]] | None = None,
    node_threshold: float = 0.8,
    edge_threshold: float = 0.98,
    corpus: str = "",
    footer: str = "",
) -> dict[str, Any]:
    """The page's data: the kept nodes (their kind, place, activation, influence, label and
    contexts) and edges [source, target, weight] between them, by index into the nodes."""
    pruned = graph.prune(node_threshold, edge_threshold)
    kinds, ids = graph.node_kinds(), node_ids(graph)
    kept = pruned.nodes.nonzero().flatten().tolist()
    where = {node: i for i, node in enumerate(kept)}
    f, t = len(graph.features), graph.n_pos
    nodes = []
    for node in kept:
        kind = kinds[node]
        entry: dict[str, Any] = {"id": ids[node], "node": node, "kind": kind,
                                 "influence": float(pruned.cumulative[node])}  # fmt: skip
        if kind == "feature":
            layer, pos, feature = graph.features[node].tolist()
            found = (contexts or {}).get(node, [])
            top = f" “{found[0][1].strip()}”" if found else ""
            entry |= {"layer": layer, "pos": pos, "feature": feature,
                      "activation": float(graph.activations[node]),
                      "label": f"L{layer} #{feature}{top}", "contexts": found}  # fmt: skip
        elif kind == "error":
            layer, pos = divmod(node - f, t)
            entry |= {"layer": layer, "pos": pos, "label": f"error L{layer} @{pos}"}
        elif kind == "token":
            pos = node - f - graph.layers * t
            entry |= {"layer": -1, "pos": pos, "label": f"token {tokens[pos]!r}"}
        else:
            k = node - (len(kinds) - len(graph.logit_tokens))
            p = float(graph.logit_probabilities[k])
            entry |= {"layer": graph.layers, "pos": t - 1,
                      "label": f"→ {logit_strings[k]!r} (p={p:.3f})"}  # fmt: skip
        nodes.append(entry)
    targets, sources = pruned.edges.nonzero(as_tuple=True)
    weights = graph.adjacency[targets, sources]
    if len(weights) > MAX_EDGES:
        keep = weights.abs().topk(MAX_EDGES).indices.sort().values
        targets, sources, weights = targets[keep], sources[keep], weights[keep]
    edges = [[where[s], where[d], float(f"{w:.6g}")]
             for d, s, w in zip(targets.tolist(), sources.tolist(), weights.tolist(), strict=True)
             if s in where and d in where]  # fmt: skip
    replacement, completeness = (None if math.isnan(v) else v for v in graph.scores())
    feature_at = {tuple(graph.features[node].tolist()): where[node] for node in kept
                  if kinds[node] == "feature"}  # fmt: skip
    for run in interventions or []:  # which kept nodes each intervention changed
        run["at"] = [feature_at[f] for f in map(tuple, run.get("features", [])) if f in feature_at]
    return {
        "prompt": prompt, "tokens": tokens, "layers": graph.layers, "nodes": nodes,
        "edges": edges, "corpus": corpus, "interventions": interventions or [],
        "scores": {"replacement": replacement, "completeness": completeness},
        "footer": footer,
    }  # fmt: skip


def graph_html(data: dict[str, Any]) -> AttentionView:
    """The page of ``graph_data``'s data: ``.save(path)`` writes it."""
    page = render("graph.html", ("graph.css",), SCRIPTS, data,
                  title="glassformer attribution graph", data_id="graph-data")  # fmt: skip
    return AttentionView(page)
