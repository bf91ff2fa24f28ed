"""The circuit page: one self-contained HTML file, offline, of a task's circuit.

``circuit_data(scores, methods, ...)`` lays the model's components out by layer (the
embeddings at the bottom, then each layer's heads and its MLP, the logits at the top) and
sends the real edges ranked by |score| (the strongest ``MAX_EDGES``); a slider over MIB's
circuit sizes draws that many top edges, each as wide as its score allows (``edgeWidth`` in
``html/circuit.js``: 0.4 px plus up to 4 for the largest), beside the faithfulness measured
at that size for every method (EAP-IG, EAP, random circuits), their curves, CPR and CMD.

The viewer's conventions hold: the data is JSON in a ``<script type="application/json">``
element, the script and style are package files inlined under a Content-Security-Policy that
allows no request, and every name enters the page as text.
"""

from __future__ import annotations

from typing import Any

from glassformer.inspect.attribution import EdgeAttribution
from glassformer.inspect.circuits import Faithfulness
from glassformer.viz.page import render
from glassformer.viz.viewer import AttentionView

SCRIPTS = ("helpers.js", "circuit.js")
MAX_EDGES = 4_000  # the strongest edges sent at most (larger circuits draw these)


def _component(name: str) -> str:
    return name if name.count(".") < 2 else name.rsplit(".", 1)[0]


def circuit_data(
    scores: EdgeAttribution,
    methods: list[tuple[str, Faithfulness]],
    *,
    subtitle: str = "",
    footer: str = "",
    goal: float = 0.8,
) -> dict[str, Any]:
    """The page's data; ``methods``: (name, its faithfulness curve), the first the main."""
    layers = 1 + max(int(n.split(".")[0][1:]) for n in scores.writers if n.startswith("L"))
    heads = 1 + max(int(n.split(".")[1][1:]) for n in scores.writers if ".H" in n)
    nodes: list[dict[str, Any]] = [{"id": "embed", "kind": "embed"}]
    for layer in range(layers):
        nodes += [{"id": f"L{layer}.H{h}", "kind": "head", "layer": layer, "head": h}
                  for h in range(heads)]  # fmt: skip
        nodes.append({"id": f"L{layer}.mlp", "kind": "mlp", "layer": layer})
    nodes.append({"id": "logits", "kind": "logits"})
    index = {node["id"]: i for i, node in enumerate(nodes)}
    total = scores.scores.sum(2)
    written = total.sum(1)
    for w, name in enumerate(scores.writers):
        nodes[index[name]]["score"] = float(written[w])
    nodes[-1]["score"] = float(total[:, scores.readers.index("logits")].sum())
    ranked = total.abs().masked_fill(~scores.edges, -1.0).flatten().argsort(descending=True)
    edges = []
    for flat in ranked[: min(MAX_EDGES, int(scores.edges.sum()))].tolist():
        w, r = divmod(flat, total.size(1))
        reader = scores.readers[r]
        edges.append([index[scores.writers[w]], index[_component(reader)],
                      reader.rsplit(".", 1)[-1], float(f"{float(total[w, r]):.6g}")])  # fmt: skip
    main = methods[0][1]
    reached = [i for i, f in enumerate(main.absolute) if f >= goal]
    return {
        "layers": layers, "heads": heads, "nodes": nodes, "edges": edges,
        "fractions": list(main.fractions), "sizes": list(main.sizes),
        "real": int(scores.edges.sum()),
        "methods": [{"name": name, "absolute": list(curve.absolute), "signed": list(curve.signed),
                     "cpr": curve.cpr, "cmd": curve.cmd} for name, curve in methods],
        "initial": reached[0] if reached else len(main.sizes) // 2,
        "subtitle": subtitle, "footer": footer,
    }  # fmt: skip


def circuit_html(data: dict[str, Any]) -> AttentionView:
    """The page of ``circuit_data``'s data: ``.save(path)`` writes it."""
    page = render("circuit.html", ("graph.css", "circuit.css"), SCRIPTS, data,
                  title="glassformer circuit", data_id="circuit-data")  # fmt: skip
    return AttentionView(page)
