"""circuit-tracer's side of tests/test_graph.py, run in its own environment (circuit-tracer
pins transformers < 5 and huggingface_hub < 1, so it cannot share the test extra's):

    .venv-peers/circuit-tracer/bin/python tests/peers/circuit_tracer_graph.py WORK [WORK ...]

Each WORK holds job.json (the model's shape, the text's ids, the attribution options),
model.safetensors (a glassformer GPT's weights) and transcoders/ (a circuit-tracer
directory that glassformer wrote). The model is rebuilt as a TransformerLens
HookedTransformer from those weights, circuit-tracer's ReplacementModel is built around it,
and its ``attribute`` writes WORK/result.safetensors (the adjacency and every node list) and
WORK/result.json (the scores, the logits' token ids). Nothing here imports glassformer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from circuit_tracer.attribution.attribute import attribute
from circuit_tracer.graph import compute_graph_scores, prune_graph
from circuit_tracer.replacement_model.replacement_model_transformerlens import (
    TransformerLensReplacementModel,
)
from circuit_tracer.utils.caching import load_transcoders_from_cache
from circuit_tracer.utils.create_graph_files import create_nodes, create_used_nodes_and_edges
from safetensors.torch import load_file, save_file
from transformer_lens import HookedTransformerConfig


class Tokenizer:
    """What circuit-tracer asks of a tokenizer, for ids that start with BOS (id 1)."""

    all_special_ids = [1]
    bos_token_id = pad_token_id = eos_token_id = 1
    vocab_size = 0
    padding_side = "right"

    def decode(self, ids: object) -> str:
        return " ".join(str(int(i)) for i in torch.as_tensor(ids).reshape(-1))


def tl_config(job: dict) -> HookedTransformerConfig:
    c = job["config"]
    llama = c["norm"] == "rms"
    return HookedTransformerConfig(
        n_layers=c["num_layers"],
        d_model=c["d_model"],
        n_ctx=c["max_len"],
        d_head=c["d_model"] // c["num_heads"],
        n_heads=c["num_heads"],
        n_key_value_heads=c.get("num_kv_heads"),
        d_mlp=c["d_ff"],
        d_vocab=c["vocab_size"],
        act_fn="silu" if llama else "gelu",
        gated_mlp=llama,
        normalization_type="RMS" if llama else "LN",
        eps=c["norm_eps"] if llama else c["layer_norm_eps"],
        positional_embedding_type="rotary" if llama else "standard",
        rotary_dim=c["d_model"] // c["num_heads"] if llama else None,
        rotary_base=c.get("rope_theta", 10000),
        default_prepend_bos=False,
        model_name="glassformer-random",
        device="cpu",
        dtype=torch.float32,
    )


def tl_weights(state: dict, cfg: HookedTransformerConfig) -> dict:
    """glassformer's names and layouts → TransformerLens's."""
    H, Dh, D = cfg.n_heads, cfg.d_head, cfg.d_model
    Hkv = cfg.n_key_value_heads or H
    out = {"embed.W_E": state["embed.weight"], "unembed.W_U": state["lm_head.weight"].T,
           "unembed.b_U": torch.zeros(cfg.d_vocab)}  # fmt: skip
    if "pos_embed.weight" in state:
        out["pos_embed.W_pos"] = state["pos_embed.weight"]
    gqa = Hkv != H
    for i in range(cfg.n_layers):
        p, q = f"blocks.{i}.", f"blocks.{i}."
        qkv = state[p + "attn.qkv_proj.weight"]  # (H·Dh + 2·Hkv·Dh, D)
        wq, wk, wv = qkv.split([H * Dh, Hkv * Dh, Hkv * Dh])
        k_name, v_name = ("attn._W_K", "attn._W_V") if gqa else ("attn.W_K", "attn.W_V")
        out[q + "attn.W_Q"] = wq.view(H, Dh, D).transpose(1, 2)
        out[q + k_name] = wk.view(Hkv, Dh, D).transpose(1, 2)
        out[q + v_name] = wv.view(Hkv, Dh, D).transpose(1, 2)
        bias = state.get(p + "attn.qkv_proj.bias")
        bq, bk, bv = (
            bias.split([H * Dh, Hkv * Dh, Hkv * Dh])
            if bias is not None
            else (torch.zeros(H * Dh), torch.zeros(Hkv * Dh), torch.zeros(Hkv * Dh))
        )
        out[q + "attn.b_Q"] = bq.view(H, Dh)
        out[q + ("attn._b_K" if gqa else "attn.b_K")] = bk.view(Hkv, Dh)
        out[q + ("attn._b_V" if gqa else "attn.b_V")] = bv.view(Hkv, Dh)
        out[q + "attn.W_O"] = state[p + "attn.out_proj.weight"].T.reshape(H, Dh, D)
        out[q + "attn.b_O"] = state.get(p + "attn.out_proj.bias", torch.zeros(D))
        for ln in ("ln1", "ln2"):
            out[q + f"{ln}.w"] = state[p + f"{ln}.weight"]
            if p + f"{ln}.bias" in state:
                out[q + f"{ln}.b"] = state[p + f"{ln}.bias"]
        if cfg.gated_mlp:
            out[q + "mlp.W_gate"] = state[p + "mlp.gate_proj.weight"].T
            out[q + "mlp.W_in"] = state[p + "mlp.up_proj.weight"].T
            out[q + "mlp.W_out"] = state[p + "mlp.down_proj.weight"].T
            out[q + "mlp.b_in"] = torch.zeros(cfg.d_mlp)
            out[q + "mlp.b_out"] = torch.zeros(D)
        else:
            out[q + "mlp.W_in"] = state[p + "mlp.linear1.weight"].T
            out[q + "mlp.b_in"] = state[p + "mlp.linear1.bias"]
            out[q + "mlp.W_out"] = state[p + "mlp.linear2.weight"].T
            out[q + "mlp.b_out"] = state[p + "mlp.linear2.bias"]
    out["ln_final.w"] = state["ln_final.weight"]
    if "ln_final.bias" in state:
        out["ln_final.b"] = state["ln_final.bias"]
    return out


def main(work: Path) -> None:
    job = json.loads((work / "job.json").read_text())
    cfg = tl_config(job)
    transcoders, _ = load_transcoders_from_cache(
        "transcoders", cache_dir=work, dtype=torch.float32, lazy_decoder=False,
        device=torch.device("cpu"),
    )  # fmt: skip
    model = TransformerLensReplacementModel(cfg)
    weights = tl_weights(load_file(work / "model.safetensors"), cfg)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [m for m in missing if not m.endswith(("IGNORE", "mask", "rotary_sin", "rotary_cos"))]
    assert not missing and not unexpected, (missing, unexpected)
    model.tokenizer = Tokenizer()
    model._configure_replacement_model(transcoders)
    ids = torch.tensor(job["ids"])
    with torch.no_grad():
        logits = model(ids[None])[0, -1]
    graph = attribute(ids, model, max_n_logits=job["max_logits"],
                      desired_logit_prob=job["logit_probability"], batch_size=job["batch_size"],
                      max_feature_nodes=job["max_feature_nodes"])  # fmt: skip
    replacement, completeness = compute_graph_scores(graph)
    pruned = prune_graph(graph, 0.8, 0.98)
    save_file({
        "adjacency": graph.adjacency_matrix.contiguous(),
        "active_features": graph.active_features.contiguous(),
        "selected_features": graph.selected_features.contiguous(),
        "activation_values": graph.activation_values.contiguous(),
        "logit_probabilities": graph.logit_probabilities.contiguous(),
        "logits": logits.contiguous(),
        "node_mask": pruned.node_mask.contiguous(),
        "edge_mask": pruned.edge_mask.contiguous(),
        "cumulative": pruned.cumulative_scores.contiguous(),
    }, str(work / "result.safetensors"))  # fmt: skip
    nodes = create_nodes(graph, pruned.node_mask, model.tokenizer, pruned.cumulative_scores)
    used, links = create_used_nodes_and_edges(graph, nodes, pruned.edge_mask)
    (work / "result.json").write_text(json.dumps({
        "logit_tokens": [t.vocab_idx for t in graph.logit_targets],
        "replacement": replacement, "completeness": completeness,
        "nodes": [node.model_dump() for node in used], "links": links,
    }))  # fmt: skip


if __name__ == "__main__":
    for work in sys.argv[1:]:  # one process for every case: the imports take seconds
        main(Path(work))
