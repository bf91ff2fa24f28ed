"""circuit-tracer's transcoder directories: read and written, by their own field names.

circuit-tracer (Anthropic and Decode Research's attribution-graph library) keeps a set of
transcoders as a directory with a ``config.yaml`` (``model_kind``, ``feature_input_hook``,
``feature_output_hook``, ``scan``) and, for ``model_kind: transcoder_set`` (one per layer),
``layer_{i}.safetensors`` holding ``W_enc`` (d_transcoder, d_model), ``W_dec``
(d_transcoder, d_model), ``b_enc``, ``b_dec``, and optionally ``W_skip`` (d_model, d_model)
and ``activation_function.threshold`` (JumpReLU); for ``model_kind:
cross_layer_transcoder``, ``W_enc_{i}.safetensors`` (``W_enc_{i}``, ``b_enc_{i}``,
``b_dec_{i}``, optionally ``threshold_{i}``) and ``W_dec_{i}.safetensors`` (``W_dec_{i}``,
(d_transcoder, n − i, d_model)). That is the layout of its local cache
(``circuit_tracer.utils.caching.load_transcoders_from_cache``), which reads what this writes.

circuit-tracer's activations are ReLU and JumpReLU: TopK transcoders (what ``train
transcoder`` trains) have no equivalent there and are refused in one line; so is a
cross-layer set with a skip term, which its loader does not read. The hooks are
TransformerLens's: glassformer's ``ln2.hook_normalized`` (the MLP's input) is written as
``mlp.hook_in``, and ``mlp.hook_in`` / ``mlp.hook_out`` read as the MLP's input and
output; ``hook_resid_mid`` and ``hook_mlp_out`` are the same in both. The config is
written as JSON, which YAML parsers read; a YAML one is read with PyYAML where installed.

``graph_json`` writes an attribution graph in circuit-tracer's graph schema (the JSON its
``create_graph_files`` writes for its frontend).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from glassformer.atomic import write_directory_atomically
from glassformer.checkpoint import FOREIGN_MARKERS, register_format
from glassformer.errors import CheckpointError, one_line, shown
from glassformer.inspect.graph import AttributionGraph
from glassformer.models.transcoder import TranscoderConfig, Transcoders

CONFIG = "config.yaml"
MAX_CONFIG = 1 << 20  # bytes: a config is a few lines
# TransformerLens's hook names where they differ from glassformer's: its
# ``ln2.hook_normalized`` is the norm's output *before* its weight and bias, so the MLP's
# input (glassformer's ``ln2.hook_normalized``) is ``mlp.hook_in`` there.
WRITTEN = {"ln2.hook_normalized": "mlp.hook_in"}
READ = {"mlp.hook_in": "ln2.hook_normalized", "mlp.hook_out": "hook_mlp_out"}
NOT_READ = ("ln2.hook_normalized", "ln1.hook_normalized")


def write_circuit_tracer(transcoders: Transcoders, path: str | Path, *, scan: str = "") -> Path:
    """``transcoders`` as a circuit-tracer directory at ``path`` (written atomically)."""
    config = transcoders.config
    if config.architecture == "topk":
        raise ValueError(
            "circuit-tracer reads ReLU and JumpReLU transcoders; these are TopK "
            "(keep glassformer's own format for them)"
        )
    if config.cross_layer and config.skip:
        raise ValueError("circuit-tracer's cross-layer transcoders have no skip term to read")
    if tuple(config.layers) != tuple(range(config.n_layers)):
        raise ValueError(
            f"circuit-tracer needs a transcoder for each of blocks 0 … n − 1; these cover "
            f"blocks {list(config.layers)}"
        )
    weights = transcoders.folded()
    meta = {
        "model_kind": "cross_layer_transcoder" if config.cross_layer else "transcoder_set",
        "feature_input_hook": WRITTEN.get(config.input_hook, config.input_hook),
        "feature_output_hook": WRITTEN.get(config.output_hook, config.output_hook),
        "scan": scan or config.model_name or "glassformer",
    }

    def write(tmp: Path) -> None:
        for i in range(config.n_layers):
            for name, tensors in _layer_files(config, weights, i).items():
                save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / name))
        (tmp / CONFIG).write_text(json.dumps(meta, indent=2) + "\n")

    return write_directory_atomically(Path(path), write)


def _layer_files(
    config: TranscoderConfig, weights: dict[str, torch.Tensor], i: int
) -> dict[str, dict[str, torch.Tensor]]:
    """The file(s) of layer i and their tensors, by circuit-tracer's names."""
    jump = config.architecture == "jumprelu"
    if config.cross_layer:
        enc = {f"W_enc_{i}": weights["W_enc"][i], f"b_enc_{i}": weights["b_enc"][i],
               f"b_dec_{i}": weights["b_dec"][i]}  # fmt: skip
        if jump:
            enc[f"threshold_{i}"] = weights["threshold"][i]
        dec = {f"W_dec_{i}": weights[f"W_dec.{i}"]}
        return {f"W_enc_{i}.safetensors": enc, f"W_dec_{i}.safetensors": dec}
    layer = {"W_enc": weights["W_enc"][i], "W_dec": weights["W_dec"][i],
             "b_enc": weights["b_enc"][i], "b_dec": weights["b_dec"][i]}  # fmt: skip
    if jump:
        layer["activation_function.threshold"] = weights["threshold"][i]
    if config.skip:
        layer["W_skip"] = weights["W_skip"][i]
    return {f"layer_{i}.safetensors": layer}


def read_circuit_tracer(path: str | Path, kind: str | None = None) -> Transcoders:
    """Transcoders from a circuit-tracer directory (see the module's docstring)."""
    path = Path(path)
    if kind not in (None, "transcoder"):
        raise CheckpointError(f"{path} holds circuit-tracer transcoders, expected {kind!r}")
    meta = _read_config(path / CONFIG)
    model_kind = meta.get("model_kind")
    if model_kind not in ("transcoder_set", "cross_layer_transcoder"):
        raise CheckpointError(
            f"{path / CONFIG}: model_kind {shown(model_kind)}; circuit-tracer's are "
            "'transcoder_set' and 'cross_layer_transcoder'"
        )
    cross = model_kind == "cross_layer_transcoder"
    stem = "W_enc_{}.safetensors" if cross else "layer_{}.safetensors"
    n = 0
    while (path / stem.format(n)).is_file():
        n += 1
    if n == 0:
        raise CheckpointError(f"{path} holds no {stem.format(0)}")
    files = [_read(path / stem.format(i)) for i in range(n)]
    if cross:
        for i in range(n):
            files[i].update(_read(path / f"W_dec_{i}.safetensors"))
    return _assemble(path, meta, files, cross)


def _assemble(path: Path, meta: dict[str, Any], files: list[dict[str, Any]],
              cross: bool) -> Transcoders:  # fmt: skip
    """The set of transcoders the files' tensors make, their shapes checked."""
    key = (lambda name, i: f"{name}_{i}") if cross else (lambda name, i: name)
    threshold = "threshold" if cross else "activation_function.threshold"
    first = files[0]
    for hook in (meta.get("feature_input_hook"), meta.get("feature_output_hook")):
        if hook in NOT_READ:
            raise CheckpointError(
                f"{path / CONFIG}: {hook} is TransformerLens's norm output before its weight "
                "and bias, which glassformer has no hook point for"
            )
    try:
        d_transcoder, d_model = first[key("W_enc", 0)].shape
        config = TranscoderConfig(
            d_model=d_model,
            d_transcoder=d_transcoder,
            layers=tuple(range(len(files))),
            architecture="jumprelu" if key(threshold, 0) in first else "relu",
            cross_layer=cross,
            skip="W_skip" in first,
            input_hook=READ.get(meta["feature_input_hook"], meta["feature_input_hook"]),
            output_hook=READ.get(meta["feature_output_hook"], meta["feature_output_hook"]),
            model_name=str(meta.get("scan") or ""),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path} is not a circuit-tracer directory: {one_line(e)}") from None
    with torch.device("meta"):
        wanted = Transcoders(config).state_dict()
    state: dict[str, Any] = {}
    for name in ("W_enc", "b_enc", "b_dec", "threshold", "W_skip"):
        if name not in wanted:
            continue
        stored = "activation_function.threshold" if name == "threshold" and not cross else name
        rows = [f.get(key(stored, i)) for i, f in enumerate(files)]
        state[name] = _stacked(path, name, rows, wanted[name].shape)
    if cross:
        for i in range(config.n_layers):
            name = f"W_dec.{i}"
            state[name] = _stacked(path, name, [files[i].get(f"W_dec_{i}")],
                                   (1, *wanted[name].shape))[0]  # fmt: skip
    else:
        state["W_dec"] = _stacked(path, "W_dec", [f.get("W_dec") for f in files],
                                  wanted["W_dec"].shape)  # fmt: skip
    model = Transcoders(config)
    model.load_state_dict({**state, "since_fired": model.since_fired}, strict=True)
    return model.eval()


def _stacked(path: Path, name: str, rows: list[Any], shape: Any) -> torch.Tensor:
    """The layers' tensors stacked, each present and of the shape the config makes."""
    if any(r is None for r in rows) or any(tuple(r.shape) != tuple(shape[1:]) for r in rows):
        got = [None if r is None else tuple(r.shape) for r in rows]
        raise CheckpointError(
            f"{path}: {name} per layer should be {tuple(shape[1:])}, got {shown(got, 200)}"
        )
    return torch.stack([r.float() for r in rows])


def _read(file: Path) -> dict[str, torch.Tensor]:
    try:
        with safe_open(str(file), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    except Exception as e:  # safetensors raises its own types
        raise CheckpointError(f"cannot read {file}: {one_line(e)}") from None


def _read_config(file: Path) -> dict[str, Any]:
    """config.yaml: JSON (what glassformer writes), else YAML through PyYAML."""
    try:
        with open(file, "rb") as f:
            raw = f.read(MAX_CONFIG + 1)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"cannot read {file}: {one_line(e)}") from None
    if len(raw) > MAX_CONFIG:
        raise CheckpointError(f"{file} is over {MAX_CONFIG:,} bytes: not a transcoder config")
    try:
        meta = json.loads(text)
    except json.JSONDecodeError:
        try:
            import yaml
        except ImportError:
            raise CheckpointError(
                f"{file} is YAML: reading it needs PyYAML (pip install pyyaml)"
            ) from None
        try:
            meta = yaml.safe_load(text)
        except (yaml.YAMLError, RecursionError) as e:
            raise CheckpointError(f"{file} is not YAML: {one_line(e)}") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{file} is not a circuit-tracer config: not a mapping")
    return meta


FOREIGN_MARKERS.setdefault(CONFIG, "circuit-tracer")
register_format("circuit-tracer", "transcoder", read_circuit_tracer)


def graph_json(
    graph: AttributionGraph,
    *,
    prompt: str,
    tokens: list[str],
    logit_strings: list[str],
    slug: str,
    scan: str,
    node_threshold: float = 0.8,
    edge_threshold: float = 0.98,
) -> dict[str, Any]:
    """A graph in circuit-tracer's JSON schema (``create_graph_files``'s, which its
    frontend and Neuronpedia read): the pruned graph's nodes, with their ids, layers,
    context indices and cumulative influence, and its kept edges as links."""
    pruned = graph.prune(node_threshold, edge_threshold)
    kinds, t, f = graph.node_kinds(), graph.n_pos, len(graph.features)
    nodes: dict[int, dict[str, Any]] = {}
    for node in pruned.nodes.nonzero().flatten().tolist():
        influence = float(pruned.cumulative[node])
        nodes[node] = _json_node(graph, kinds[node], node, f, t, influence, logit_strings)
    targets, sources = pruned.edges.nonzero(as_tuple=True)
    links = [{"source": nodes[s]["node_id"], "target": nodes[d]["node_id"],
              "weight": float(graph.adjacency[d, s])}
             for d, s in zip(targets.tolist(), sources.tolist(), strict=True)
             if s in nodes and d in nodes]  # fmt: skip
    linked = {link["source"] for link in links} | {link["target"] for link in links}
    used = [n for n in nodes.values()
            if n["node_id"] in linked or n["feature_type"] in ("embedding", "logit")]  # fmt: skip
    metadata = {"slug": slug, "scan": scan, "transcoder_list": [], "prompt_tokens": tokens,
                "prompt": prompt, "node_threshold": node_threshold,
                "schema_version": 1}  # fmt: skip
    q_params = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "",
                "sg_pos": ""}  # fmt: skip
    return {"metadata": metadata, "qParams": q_params, "nodes": used, "links": links}


def _json_node(graph: AttributionGraph, kind: str, node: int, f: int, t: int, influence: float,
               logit_strings: list[str]) -> dict[str, Any]:  # fmt: skip
    """One node as circuit-tracer's frontend ``Node`` has it."""
    base = {"token_prob": 0.0, "is_target_logit": False, "run_idx": 0, "reverse_ctx_idx": 0,
            "clerp": "", "influence": influence, "activation": None}  # fmt: skip
    if kind == "feature":
        layer, pos, feature = (int(v) for v in graph.features[node].tolist())
        pairing = (layer + feature) * (layer + feature + 1) // 2 + feature  # Cantor's
        return {**base, "node_id": f"{layer}_{feature}_{pos}", "feature": pairing,
                "layer": str(layer), "ctx_idx": pos, "feature_type": "cross layer transcoder",
                "jsNodeId": f"{layer}_{feature}-0",
                "activation": float(graph.activations[node])}  # fmt: skip
    if kind == "error":
        layer, pos = divmod(node - f, t)
        return {**base, "node_id": f"0_{layer}_{pos}", "feature": -1, "layer": str(layer),
                "ctx_idx": pos, "feature_type": "mlp reconstruction error",
                "jsNodeId": f"{layer}_{pos}-0"}  # fmt: skip
    if kind == "token":
        pos = node - f - graph.layers * t
        token = int(graph.tokens[pos])
        return {
            **base,
            "node_id": f"E_{token}_{pos}",
            "feature": pos,
            "layer": "E",
            "ctx_idx": pos,
            "feature_type": "embedding",
            "jsNodeId": f"E_{token}-{pos}",
        }
    k = node - (len(graph.node_kinds()) - len(graph.logit_tokens))
    token, p = int(graph.logit_tokens[k]), float(graph.logit_probabilities[k])
    layer = graph.layers + 1
    return {**base, "node_id": f"{layer}_{token}_{t - 1}", "feature": token, "layer": str(layer),
            "ctx_idx": t - 1, "feature_type": "logit", "token_prob": p,
            "is_target_logit": k == 0, "jsNodeId": f"L_{token}-{t - 1}",
            "clerp": f'Output "{logit_strings[k]}" (p={p:.3f})', "influence": None}  # fmt: skip
