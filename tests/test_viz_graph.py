"""The attribution-graph page (glassformer.viz.graph_page): what it holds, its size at 2,000
feature nodes, and, in a real browser with the network refused, that it loads with no
request, draws every kept edge at the width its adjacency weight gives, and shows a hostile
token or label as text."""

from __future__ import annotations

import pytest
import torch

from glassformer.inspect.graph import AttributionGraph
from glassformer.inspect.tracing import attribution_graph
from glassformer.viz.graph_page import graph_data, graph_html
from tests.graph_models import IDS, small_model, small_transcoders
from tests.test_viz_html import Opened

HOSTILE = '<img src=x onerror="alert(1)">'


def _page_data(contexts: bool = True) -> tuple[AttributionGraph, dict]:
    graph = attribution_graph(small_model("gpt2"), small_transcoders("relu"), IDS, batch_size=16)
    tokens = [HOSTILE if i == 2 else f"t{int(t)}" for i, t in enumerate(IDS)]
    label = [(HOSTILE, "</script><b>x</b>", " after", 1.5)]
    labels = {n: label for n in range(len(graph.features))}
    run = {"what": "zeroing one", "features": [graph.features[0].tolist()],
           "before": [["a", 0.5]], "after": [["b", 0.4]]}  # fmt: skip
    data = graph_data(graph, tokens=tokens, logit_strings=[f"l{i}" for i in range(10)],
                      prompt="a prompt", contexts=labels if contexts else None,
                      interventions=[run], corpus="austen", footer="test")  # fmt: skip
    return graph, data


def test_the_page_holds_the_kept_nodes_and_their_edges():
    graph, data = _page_data()
    pruned = graph.prune(0.8, 0.98)
    assert len(data["nodes"]) == int(pruned.nodes.sum())
    for source, target, weight in data["edges"]:
        s, t = data["nodes"][source]["node"], data["nodes"][target]["node"]
        assert bool(pruned.edges[t, s])
        assert weight == pytest.approx(float(graph.adjacency[t, s]), rel=1e-5, abs=1e-9)
    assert len(data["edges"]) == int(pruned.edges[pruned.nodes][:, pruned.nodes].sum())


def test_a_page_of_two_thousand_feature_nodes_is_under_five_megabytes(tmp_path):
    torch.manual_seed(0)
    layers, t, f = 30, 8, 2000
    features = torch.stack([torch.randint(0, layers, (f,)), torch.randint(1, t, (f,)),
                            torch.randint(0, 4608, (f,))], 1)  # fmt: skip
    features = features[torch.argsort(features[:, 0] * 10**6 + features[:, 1] * 10**4)]
    n = f + layers * t + t + 10
    adjacency = torch.zeros(n, n)
    rank = torch.cat([features[:, 0], torch.arange(layers).repeat_interleave(t),
                      torch.full((t,), -1), torch.full((10,), layers)])  # fmt: skip
    later = rank[:, None] > rank[None, :]
    adjacency[later] = torch.randn(int(later.sum())) * torch.rand(int(later.sum())).pow(8)
    graph = AttributionGraph(torch.arange(t) + 1, features, torch.rand(f), torch.arange(10),
                             torch.full((10,), 0.09), adjacency, layers, f)  # fmt: skip
    labels = {i: [("the words before it " * 2, " word", " and after", 3.25)] * 4 for i in range(f)}
    data = graph_data(graph, tokens=[f"token{i}" for i in range(t)],
                      logit_strings=[f"l{i}" for i in range(10)], prompt="p", contexts=labels,
                      node_threshold=1.0)  # fmt: skip
    assert sum(node["kind"] == "feature" for node in data["nodes"]) > 1900
    path = graph_html(data).save(tmp_path / "big.html")
    assert path.stat().st_size <= 5_000_000


@pytest.mark.browser
def test_the_page_loads_offline_draws_the_adjacency_and_shows_hostile_text(browser, tmp_path):
    graph, data = _page_data()
    path = graph_html(data).save(tmp_path / "graph.html")
    view = Opened(browser, path)
    try:
        view.offline_and_clean()
        page = view.page
        drawn = page.evaluate(
            "[...document.querySelectorAll('#graph-svg line.edge')].map(l => [+l.dataset.source,"
            " +l.dataset.target, +l.dataset.weight, +l.getAttribute('stroke-width')])"
        )
        assert len(drawn) == len(data["edges"])
        largest = max(abs(w) for _, _, w in data["edges"])
        for source, target, weight, width in drawn:
            s, t = data["nodes"][source]["node"], data["nodes"][target]["node"]
            assert weight == pytest.approx(float(graph.adjacency[t, s]), rel=1e-5, abs=1e-9)
            assert width == pytest.approx(0.4 + 4 * abs(weight) / largest, abs=1e-3)
        assert HOSTILE in page.locator("#graph-svg text.token").all_text_contents()
        feature = page.locator("#graph-svg [data-kind='feature']").first
        feature.click()
        panel = page.locator("#panel").inner_text()
        assert "</script><b>x</b>" in panel and "edges in" in panel
        assert page.locator("img").count() == 0 and page.locator("b").count() == 0
        view.offline_and_clean()
    finally:
        view.close()
