"""Attribution graphs (glassformer.inspect.graph) against circuit-tracer, the library the
method's authors published, with the same weights: the adjacency to 1e-4 of its largest
edge (float32 products summed in another order), the same nodes, logits, scores and pruning;
and every edge against what it claims: zero the source in the held model and the target
moves by the edge's weight."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from glassformer.inspect.replacement import intervene
from glassformer.inspect.tracing import attribution_graph
from glassformer.interop.circuit_tracer import graph_json, write_circuit_tracer
from tests.graph_models import IDS, KINDS, SHAPES, small_model, small_transcoders

PEER = Path(__file__).parents[1] / ".venv-peers" / "circuit-tracer" / "bin" / "python"
SCRIPT = Path(__file__).parent / "peers" / "circuit_tracer_graph.py"
CASES = [(shape, kind, None) for shape in SHAPES for kind in KINDS]
CASES += [("gpt2", "relu", 60), ("llama", "cross-layer", 50)]  # fewer feature nodes kept


def _case_id(case: tuple) -> str:
    shape, kind, keep = case
    return f"{shape}-{kind}" + (f"-keep{keep}" if keep else "")


@pytest.fixture(scope="module")
def peer_graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple, Path]:
    """circuit-tracer's graph of every case, computed in its own environment at once."""
    if not PEER.is_file():
        pytest.fail(f"circuit-tracer's environment is missing: run `make peers` ({PEER})")
    works = {}
    for case in CASES:
        shape, kind, keep = case
        work = tmp_path_factory.mktemp(_case_id(case))
        model, tc = small_model(shape), small_transcoders(kind)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                  str(work / "model.safetensors"))  # fmt: skip
        write_circuit_tracer(tc, work / "transcoders")
        job = {"config": dataclasses.asdict(model.config), "ids": IDS.tolist(),
               "max_logits": 10, "logit_probability": 0.95, "batch_size": 16,
               "max_feature_nodes": keep}  # fmt: skip
        (work / "job.json").write_text(json.dumps(job))
        works[case] = work
    done = subprocess.run([str(PEER), str(SCRIPT), *map(str, works.values())],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return works


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_the_adjacency_equals_circuit_tracers(case: tuple, peer_graphs: dict) -> None:
    shape, kind, keep = case
    theirs = load_file(str(peer_graphs[case] / "result.safetensors"))
    meta = json.loads((peer_graphs[case] / "result.json").read_text())
    model, tc = small_model(shape), small_transcoders(kind)
    with torch.no_grad():  # the two models are one model
        logits = model(IDS[None]).logits[0, -1]
    torch.testing.assert_close(logits, theirs["logits"], atol=1e-5, rtol=1e-5)

    graph = attribution_graph(model, tc, IDS, batch_size=16, max_feature_nodes=keep)
    selected = theirs["active_features"][theirs["selected_features"].long()]
    assert torch.equal(graph.features, selected.long())  # (layer, position, feature), in order
    assert graph.active_features == len(theirs["active_features"])
    chosen = theirs["selected_features"].long()
    torch.testing.assert_close(graph.activations, theirs["activation_values"][chosen])
    assert graph.logit_tokens.tolist() == meta["logit_tokens"]
    torch.testing.assert_close(graph.logit_probabilities, theirs["logit_probabilities"])
    scale = float(theirs["adjacency"].abs().max())
    assert graph.adjacency.shape == theirs["adjacency"].shape
    assert float((graph.adjacency - theirs["adjacency"]).abs().max()) <= 1e-4 * scale
    replacement, completeness = graph.scores()
    assert replacement == pytest.approx(meta["replacement"], abs=1e-5)
    assert completeness == pytest.approx(meta["completeness"], abs=1e-5)
    pruned = graph.prune(0.8, 0.98)
    assert torch.equal(pruned.nodes, theirs["node_mask"])
    assert torch.equal(pruned.edges, theirs["edge_mask"])
    torch.testing.assert_close(pruned.cumulative, theirs["cumulative"])


def _logit_reads(out, graph) -> torch.Tensor:
    logits = out.logits[0, -1].float()
    return logits[graph.logit_tokens] - logits.mean()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_every_edge_is_the_effect_of_removing_its_source(shape: str, kind: str) -> None:
    """Each source (feature, error, token) removed in the held model (attention, norms and
    MLP outputs at the clean run's): every feature's evidence and every logit node's read
    (its logit minus the mean logit) moves by minus the edge's weight."""
    model, tc = small_model(shape), small_transcoders(kind)
    graph = attribution_graph(model, tc, IDS, batch_size=16)
    base = intervene(model, tc, IDS, direct=True)
    f, t = len(graph.features), graph.n_pos
    layer, pos, feat = graph.features.unbind(1)
    scale = float(graph.adjacency.abs().max())

    def check(out, source: int) -> None:
        moved = torch.cat([(out.evidence - base.evidence)[layer, pos, feat],
                           _logit_reads(out, graph) - _logit_reads(base, graph)])  # fmt: skip
        edges = torch.cat([graph.adjacency[:f, source], graph.adjacency[-len(moved) + f :, source]])
        assert float((moved + edges).abs().max()) <= 2e-4 * scale, source

    for s in range(f):
        check(intervene(model, tc, IDS, [(int(layer[s]), int(pos[s]), int(feat[s]), 0.0)],
                        direct=True), s)  # fmt: skip
    errors = base_errors(model, tc)
    for j in range(graph.layers):
        for p in range(t):
            hooks = [(tc.config.hook(j, "output"), _minus(p, errors[j, p]))]
            check(intervene(model, tc, IDS, direct=True, hooks=hooks), f + j * t + p)
    embeds = model.run_with_cache(IDS[None], names=["hook_embed"])[1]["hook_embed"][0]
    for p in range(t):
        out = intervene(model, tc, IDS, direct=True, hooks=[("hook_embed", _minus(p, embeds[p]))])
        check(out, f + graph.layers * t + p)


def base_errors(model, tc) -> torch.Tensor:
    """What the transcoders miss of each MLP output (n, T, D), zero at position 0."""
    names = [tc.config.hook(i, w) for w in ("input", "output") for i in range(3)]
    _, cache = model.run_with_cache(IDS[None], names=names)
    x = torch.stack([cache[tc.config.hook(i)][0] for i in range(3)])
    y = torch.stack([cache[tc.config.hook(i, "output")][0] for i in range(3)])
    with torch.no_grad():
        z = tc.encode(x)
        z[:, 0] = 0
        error = y - tc.decode(z, x)
    error[:, 0] = 0
    return error


def _minus(position: int, vector: torch.Tensor):
    def hook(value: torch.Tensor, name: str) -> torch.Tensor:
        value = value.clone()
        value[:, position] -= vector
        return value

    return hook


def test_a_graph_needs_a_transcoder_for_every_block() -> None:
    model = small_model("gpt2")
    tc = small_transcoders("relu")
    partial = type(tc)(dataclasses.replace(tc.config, layers=(0, 1)))
    with pytest.raises(ValueError, match=r"a transcoder for every block \(0 … 2\).*\[0, 1\]"):
        attribution_graph(model, partial, IDS)


def test_pruning_keeps_every_token_and_logit_and_thresholds_are_checked() -> None:
    graph = attribution_graph(small_model("llama"), small_transcoders("relu"), IDS)
    pruned = graph.prune(0.5, 0.9)
    k, t = len(graph.logit_tokens), graph.n_pos
    assert bool(pruned.nodes[-k - t :].all())
    assert int(pruned.nodes.sum()) < len(pruned.nodes)
    assert not pruned.edges[~pruned.nodes].any() and not pruned.edges[:, ~pruned.nodes].any()
    with pytest.raises(ValueError, match="node_threshold must be between 0 and 1, got 1.5"):
        graph.prune(1.5)


def test_the_json_export_is_circuit_tracers_for_the_same_graph(peer_graphs: dict) -> None:
    """``graph_json`` against circuit-tracer's own ``create_nodes`` and
    ``create_used_nodes_and_edges`` on the same pruned graph: the same nodes (ids, kinds,
    layers, positions, influence, activations, logit probabilities) and the same links."""
    case = ("llama", "relu", None)
    theirs = json.loads((peer_graphs[case] / "result.json").read_text())
    model, tc = small_model("llama"), small_transcoders("relu")
    graph = attribution_graph(model, tc, IDS, batch_size=16)
    logit_strings = [str(int(t)) for t in graph.logit_tokens]  # the peer's tokenizer's decode
    ours = graph_json(graph, prompt="p", tokens=[str(int(t)) for t in IDS],
                      logit_strings=logit_strings, slug="s", scan="x")  # fmt: skip
    fields = ("node_id", "feature", "layer", "ctx_idx", "feature_type", "is_target_logit",
              "jsNodeId", "clerp")  # fmt: skip
    assert [{k: n[k] for k in fields} for n in ours["nodes"]] == [
        {k: n[k] for k in fields} for n in theirs["nodes"]]  # fmt: skip
    for mine, peer in zip(ours["nodes"], theirs["nodes"], strict=True):
        for key in ("influence", "activation", "token_prob"):
            assert (mine[key] is None) == (peer[key] is None), key
            if mine[key] is not None:
                assert mine[key] == pytest.approx(peer[key], abs=1e-5), (key, mine["node_id"])
    assert [(link["source"], link["target"]) for link in ours["links"]] == [
        (link["source"], link["target"]) for link in theirs["links"]]  # fmt: skip
    scale = max(abs(link["weight"]) for link in theirs["links"])
    for mine, peer in zip(ours["links"], theirs["links"], strict=True):
        assert mine["weight"] == pytest.approx(peer["weight"], abs=1e-4 * scale)
