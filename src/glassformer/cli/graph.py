"""Graph: the attribution graph of a text, with transcoders in place of the model's MLPs.

Reads TEXT with --model (by default the one the transcoders were trained on), computes the
graph of its next token (``glassformer.inspect.attribution_graph``: every direct effect
between the input tokens, the active transcoder features, the error nodes and the most
probable logits), prunes it (--node-threshold, --edge-threshold) and prints its scores, its
most influential features with their top contexts in a bundled corpus (their labels,
computed once per transcoder set and kept beside it), and what zeroing each of them does to
the next token. --out writes the offline page; --json the graph in circuit-tracer's schema.
--transcoders takes a `train transcoder` run directory or a circuit-tracer one.

    glassformer graph --transcoders runs/transcoders "The capital of France is" --out g.html
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from glassformer.models.gpt import GPT
    from glassformer.models.transcoder import Transcoders

HELP = "the attribution graph of a text, transcoders in place of the MLPs"
EXAMPLE = 'glassformer graph --transcoders runs/transcoders "The capital of France is"'


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--transcoders", required=True,
                   help="a `train transcoder` run directory or a circuit-tracer one")  # fmt: skip
    p.add_argument("text", help="the text whose next token is explained")
    p.add_argument("--model", help="the model (default: the one the transcoders read)")
    p.add_argument("--max-feature-nodes", type=int, default=2000,
                   help="feature nodes kept, the most influential (default 2000)")  # fmt: skip
    p.add_argument("--node-threshold", type=float, default=0.8,
                   help="nodes kept: those carrying this share of the influence")  # fmt: skip
    p.add_argument("--edge-threshold", type=float, default=0.98,
                   help="edges kept: those carrying this share of the influence")  # fmt: skip
    p.add_argument("--interventions", type=int, default=8,
                   help="the most influential features each zeroed, its effect shown")  # fmt: skip
    p.add_argument("--zero", action="append", default=[], metavar="L:F@P,...",
                   help="also zero these together: layer L, feature F, position P")  # fmt: skip
    p.add_argument("--corpus", help="a bundled corpus for the labels (default: the set's)")
    p.add_argument("--windows", type=int, default=96, help="windows of the corpus searched")
    p.add_argument("--batch-size", type=int, default=64, help="graph rows per backward pass")
    p.add_argument("--out", default="graph.html", help="the page (.html)")
    p.add_argument("--json", help="also write the graph in circuit-tracer's JSON schema")


def run(args: argparse.Namespace) -> int:
    import torch

    from glassformer.inference import load_run
    from glassformer.inspect import attribution_graph
    from glassformer.inspect.tracing import prompt_ids
    from glassformer.inspect.transcoders import check_transcodable
    from glassformer.models.transcoder import Transcoders

    tc = Transcoders.from_pretrained(_checkpoint(Path(args.transcoders)))
    if tc.config.rescale_acts_by_decoder_norm:  # once, not in the graph and each intervention
        tc = tc.unfolded()
    name = args.model or tc.config.model_name
    if not name:
        raise ValueError(f"{args.transcoders} does not say which model it reads: give --model")
    model, tokenizer = load_run(name)
    check_transcodable(model, tc.config)
    ids = prompt_ids(tokenizer, args.text)
    start = time.perf_counter()
    graph = attribution_graph(model, tc, torch.tensor(ids), batch_size=args.batch_size,
                              max_feature_nodes=args.max_feature_nodes)  # fmt: skip
    seconds = time.perf_counter() - start
    tokens = [tokenizer.decode([i]) for i in ids]
    logits = [tokenizer.decode([int(i)]) for i in graph.logit_tokens]
    labels = _labels(args, model, tc, tokenizer, graph)
    runs = _interventions(model, tc, tokenizer, graph, ids, args, labels)
    replacement, completeness = graph.scores()
    summary = (f"{len(graph.features)} of {graph.active_features} active features kept, "
               f"{seconds:.1f} s; replacement {replacement:.3f}, completeness "
               f"{completeness:.3f}")  # fmt: skip
    _print(graph, logits, labels, runs, summary)
    _write(args, graph, tokens, logits, labels, runs, summary, tc)
    return 0


def _checkpoint(path: Path) -> Path:
    """A run directory's checkpoint, or the directory itself."""
    return path / "checkpoint" if (path / "checkpoint").is_dir() else path


def _labels(
    args: argparse.Namespace, model: GPT, tc: Transcoders, tokenizer: Any, graph: Any
) -> dict:
    """Each kept feature node's top contexts, [(before, token, after, value)], from the
    cached contexts of the whole set (computed on first use, kept beside the set)."""
    contexts = _contexts(args, model, tc, tokenizer)
    index = {layer: i for i, layer in enumerate(tc.config.layers)}
    labels = {}
    for node, (layer, _, feature) in enumerate(graph.features.tolist()):
        found = []
        for value, window, pos in contexts.of(index[layer], feature)[:4]:
            row = contexts.windows[window].tolist()
            found.append((tokenizer.decode(row[max(0, pos - 10) : pos]),
                          tokenizer.decode(row[pos : pos + 1]),
                          tokenizer.decode(row[pos + 1 : pos + 4]), round(value, 3)))  # fmt: skip
        labels[node] = found
    return labels


def _contexts(args: argparse.Namespace, model: GPT, tc: Transcoders, tokenizer: Any) -> Any:
    import torch

    from glassformer.data import corpora
    from glassformer.errors import CheckpointError
    from glassformer.inspect.transcoders import TopContexts, top_contexts

    corpus = args.corpus or tc.config.dataset_path
    if corpus not in corpora.CORPORA:
        raise ValueError(f"the set was trained on {corpus!r}, not a bundled corpus: give --corpus")
    home = _checkpoint(Path(args.transcoders))
    reader = hashlib.sha256(str(args.model or tc.config.model_name).encode()).hexdigest()[:8]
    cached = home / f"contexts-{corpus}-{args.windows}-{reader}.safetensors"
    if cached.is_file():
        try:
            return TopContexts.load(cached, tc.config.n_layers, tc.config.d_transcoder)
        except CheckpointError as e:
            print(f"{e}: computing them again")
    print(f"labelling every feature by its top contexts in {corpus} (once) ...")
    block = tc.config.context_size
    text = corpora.load_corpus(corpus, "lm").validation
    ids = torch.tensor(tokenizer.encode(text[: block * 8 * args.windows]), dtype=torch.long)
    n = min(len(ids) // block, args.windows)
    found = top_contexts(model, tc, ids[: n * block].view(n, block))
    try:
        found.save(cached)
    except OSError as e:
        print(f"the labels are not kept ({e}): they will be computed again next time")
    return found


def _interventions(model: GPT, tc: Transcoders, tokenizer: Any, graph: Any, ids: list[int],
                   args: argparse.Namespace, labels: dict) -> list[dict]:  # fmt: skip
    """Each of the most influential features zeroed at its position (attention held), and
    the next token's top five before and after."""
    import torch

    from glassformer.inspect import intervene

    influence = graph.influence()[: len(graph.features)]
    order = influence.argsort(descending=True)[: args.interventions].tolist()
    text = torch.tensor(ids)
    before = _top(intervene(model, tc, text).logits, tokenizer)
    runs = []
    for spec in args.zero:
        changes = [(*_feature(part), 0.0) for part in spec.split(",")]
        after = _top(intervene(model, tc, text, changes).logits, tokenizer)
        chosen = [[layer, pos, feature] for layer, pos, feature, _ in changes]
        runs.append({"what": f"zeroing {spec} together", "features": chosen, "before": before,
                     "after": after, "node": None})  # fmt: skip
    for node in order:
        layer, pos, feature = graph.features[node].tolist()
        after = _top(intervene(model, tc, text, [(layer, pos, feature, 0.0)]).logits, tokenizer)
        runs.append({"what": f"zeroing L{layer} #{feature} at position {pos}",
                     "features": [[layer, pos, feature]], "before": before, "after": after,
                     "node": node})  # fmt: skip
    return runs


def _feature(spec: str) -> tuple[int, int, int]:
    """ "L:F@P" → (layer, position, feature)."""
    try:
        where, _, pos = spec.strip().partition("@")
        layer, _, feature = where.partition(":")
        return int(layer), int(pos), int(feature)
    except ValueError:
        raise ValueError(f"--zero takes L:F@P (layer, feature, position), got {spec!r}") from None


def _top(logits: Any, tokenizer: Any, k: int = 5) -> list[tuple[str, float]]:
    probs = logits[0, -1].float().softmax(-1)
    values, index = probs.topk(k)
    pairs = zip(values.tolist(), index.tolist(), strict=True)
    return [(tokenizer.decode([i]), round(v, 4)) for v, i in pairs]


def _print(graph: Any, logits: list[str], labels: dict, runs: list[dict], summary: str) -> None:
    probs = graph.logit_probabilities.tolist()
    print("next token: " + ", ".join(f"{t!r} {p:.3f}" for t, p in zip(logits, probs, strict=True)))
    print(f"graph: {summary}")
    for run in runs:
        node = run["node"]
        top = (labels.get(node) or []) if node is not None else []
        label = f" (fires on {top[0][1]!r} in …{top[0][0][-30:]!r})" if top else ""
        moved = ", ".join(f"{t!r} {p:.3f}" for t, p in run["after"][:3])
        print(f"  {run['what']}{label}: {moved}")


def _write(args: argparse.Namespace, graph: Any, tokens: list[str], logits: list[str],
           labels: dict, runs: list[dict], summary: str, tc: Any) -> None:  # fmt: skip
    from glassformer.atomic import write_atomic
    from glassformer.interop.circuit_tracer import graph_json
    from glassformer.viz.graph_page import graph_data, graph_html

    corpus = args.corpus or tc.config.dataset_path
    data = graph_data(graph, tokens=tokens, logit_strings=logits, prompt=args.text,
                      contexts=labels, interventions=[{k: v for k, v in r.items() if k != "node"}
                                                      for r in runs],
                      node_threshold=args.node_threshold, edge_threshold=args.edge_threshold,
                      corpus=corpus, footer=f"glassformer graph: {summary}")  # fmt: skip
    out = graph_html(data).save(args.out)
    print(f"{out}: the graph page ({len(data['nodes'])} nodes, {len(data['edges'])} edges)")
    if args.json:
        exported = graph_json(graph, prompt=args.text, tokens=tokens, logit_strings=logits,
                              slug=Path(args.json).stem, scan=tc.config.model_name,
                              node_threshold=args.node_threshold,
                              edge_threshold=args.edge_threshold)  # fmt: skip
        write_atomic(Path(args.json), json.dumps(exported, indent=1).encode())
        print(f"{args.json}: the graph in circuit-tracer's schema")
