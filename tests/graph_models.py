"""Small random models and transcoders for the attribution-graph tests, in the two shapes
circuit-tracer's TransformerLens side rebuilds (tests/peers/circuit_tracer_graph.py): a
GPT-2 (LayerNorm, learned positions, GELU) and a Llama (RMSNorm, rotary, grouped keys,
SwiGLU). Norm weights and biases are drawn away from 1 and 0, so a norm read wrongly shows."""

from __future__ import annotations

import torch

from glassformer import GPT, GPTConfig, TranscoderConfig, Transcoders

IDS = torch.tensor([1, 7, 9, 11, 13, 3, 21])  # BOS first, as circuit-tracer wants
SHAPES = ("gpt2", "llama")
KINDS = ("relu", "jumprelu-skip", "cross-layer", "cross-layer-jumprelu")


def small_model(shape: str, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    common = dict(vocab_size=50, max_len=16, d_model=32, num_heads=4, d_ff=64, num_layers=3,
                  dropout=0.0, attention_dropout=0.0, tie_weights=False)  # fmt: skip
    if shape == "gpt2":
        config = GPTConfig(**common, activation="gelu", positional="learned")
    else:
        config = GPTConfig(**common, num_kv_heads=2, activation="swiglu", positional="rope",
                           norm="rms", bias=False, qkv_bias=False)  # fmt: skip
    model = GPT(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" in name and name.endswith("weight"):
                p.add_(torch.randn_like(p) * 0.2)
            if "ln" in name and name.endswith("bias"):
                p.normal_(0, 0.1)
    return model


def small_transcoders(kind: str, seed: int = 1, d_transcoder: int = 40) -> Transcoders:
    torch.manual_seed(seed)
    jump = "jumprelu" in kind
    tc = Transcoders(TranscoderConfig(
        d_model=32, d_transcoder=d_transcoder, layers=(0, 1, 2),
        architecture="jumprelu" if jump else "relu", skip="skip" in kind,
        cross_layer="cross-layer" in kind))  # fmt: skip
    with torch.no_grad():
        tc.b_enc.normal_(0, 0.5)
        tc.b_dec.normal_(0, 0.1)
        if jump:
            tc.threshold.uniform_(0, 0.5)
        if tc.config.skip:
            tc.W_skip.normal_(0, 0.05)
    return tc.eval()
