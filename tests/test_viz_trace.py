"""The step-by-step trace: its shapes are the real tensors' shapes, its softmax rows are the
model's own attention weights, its recomputed attention equals the module's output.

This proves the README claim "the trace's shapes are the real tensors' and its recomputed
attention equals the module's output": the output the trace recomputes is compared here
with what a hook on each attention module saw it return, not with the trace's own note.
"""

import re

import pytest
import torch

from glassformer import (
    GPT,
    ClassifierConfig,
    GPTConfig,
    Seq2SeqConfig,
    Seq2SeqTransformer,
    TransformerClassifier,
)
from glassformer.cli import main
from glassformer.data.tokenizers import CharTokenizer
from glassformer.modules.attention import MultiHeadAttention
from glassformer.viz.trace import format_trace, trace

TEXT = "the cat sat"  # 11 characters


@pytest.fixture(scope="module")
def tok():
    return CharTokenizer("abcdefghijklmnopqrstuvwxyz .")


def gpt(tok, **kw):
    torch.manual_seed(0)
    return GPT(GPTConfig.preset("tiny", vocab_size=tok.vocab_size, num_layers=2, **kw)).eval()


def steps_named(steps, what):
    return [s for s in steps if s.what.startswith(what)]


def test_gpt_trace_shapes_match_the_real_tensors(tok):
    model = gpt(tok)
    steps = trace(model, tok, TEXT, values=5)
    T, H, D, V = 11, 4, 128, tok.vocab_size
    shapes = {s.what: s.shape for s in steps if s.where == "decoder layer 1 · self-attention"}
    assert shapes["Q = x·W_q + b_q"] == (1, T, D)
    assert shapes[f"Q split into {H} heads of {D // H}"] == (1, H, T, D // H)
    assert shapes["scores Q·Kᵀ"] == (1, H, T, T)
    assert shapes["heads merged side by side"] == (1, T, D)
    (logits,) = steps_named(steps, "lm_head")
    assert logits.shape == (1, T, V)
    with torch.no_grad():
        real = model(torch.tensor([tok.encode(TEXT)]), need_weights=True)
    torch.testing.assert_close(torch.tensor(logits.values), real.logits[0, 0, :5])
    softmaxes = steps_named(steps, "softmax over keys")
    assert len(softmaxes) == 2
    for s, weights in zip(softmaxes, real.decoder_attentions, strict=True):
        assert "rows sum to 1.0000..1.0000" in s.what
        torch.testing.assert_close(torch.tensor(s.values), weights[0, 0, 0, :5])
    (mask,) = steps_named(steps, "causal mask")[:1]
    assert f"{H * T * (T - 1) // 2} of {H * T * T} scores set to -inf" in mask.what


def test_recomputed_attention_equals_every_modules_output(tok):
    """The trace's recomputed output (its first row, all D values) equals what each attention
    module really returned, seen by a forward hook on the module, to 1e-6."""
    torch.manual_seed(0)
    v = tok.vocab_size
    model = Seq2SeqTransformer(Seq2SeqConfig.preset("tiny", src_vocab_size=v, tgt_vocab_size=v))
    returned = []  # each attention module's real output, first example and row, in call order
    handles = [
        m.register_forward_hook(lambda m, args, out: returned.append(out.output[0, 0]))
        for m in model.modules()
        if isinstance(m, MultiHeadAttention)
    ]
    try:
        steps = trace(model.eval(), tok, TEXT, target="el gato", values=model.config.d_model)
    finally:
        for h in handles:
            h.remove()
    outputs = steps_named(steps, "output projection")
    assert len(outputs) == len(returned) == 2 + 2 * 2  # encoder self; decoder self and cross
    for s, real in zip(outputs, returned, strict=True):
        assert s.shape[-1] == len(s.values) == model.config.d_model
        torch.testing.assert_close(torch.tensor(s.values), real, atol=1e-6, rtol=1e-6)
        assert float(re.search(r"within ([\d.e+-]+)", s.note).group(1)) < 1e-5
    cross = [s for s in steps if "cross-attention" in s.where and s.what == "scores Q·Kᵀ"]
    assert cross[0].shape == (1, 4, 8, 11)  # <bos> + 7 target characters × 11 source ones
    assert any(s.what == "residual sum: x + cross-attention(x)" for s in steps)


def test_modern_gpt_trace_shows_rope_gqa_rmsnorm_swiglu_and_reproduces_attention(tok):
    torch.manual_seed(0)
    config = GPTConfig.preset("llama-tiny", vocab_size=tok.vocab_size, num_layers=2)
    steps = trace(GPT(config).eval(), tok, TEXT, values=5)
    whats = [s.what for s in steps]
    assert "Q and K rotated by position (RoPE, theta=10000)" in whats
    assert "2 K/V heads each shared by 2 query heads" in whats
    assert any(w.startswith("norm1: RMSNorm") for w in whats)
    assert "down_proj(gate · up): d_ff → D" in whats
    shapes = {s.what: s.shape for s in steps if s.where == "decoder layer 1 · self-attention"}
    assert shapes["K = x·W_k"] == (1, 11, 64)  # 2 KV heads of 32, and no bias
    outputs = steps_named(steps, "output projection")
    assert len(outputs) == 2
    for s in outputs:
        assert float(re.search(r"within ([\d.e+-]+)", s.note).group(1)) < 1e-5


def test_pre_norm_and_one_layer(tok):
    model = gpt(tok)  # GPT blocks are pre-norm
    steps = trace(model, tok, TEXT, layer=2)
    layers = {s.where.split(" · ")[0] for s in steps if "layer" in s.where}
    assert layers == {"decoder layer 2"}
    assert any("before self-attention (pre-norm)" in s.what for s in steps)
    with pytest.raises(ValueError, match="layer must be in 1..2, got 3"):
        trace(model, tok, TEXT, layer=3)


def test_classifier_trace_shows_the_pooled_vector(tok):
    torch.manual_seed(0)
    config = ClassifierConfig.preset("tiny", vocab_size=tok.vocab_size, num_classes=3)
    steps = trace(TransformerClassifier(config).eval(), tok, TEXT)
    pooled, logits = steps[-2:]
    assert pooled.what.startswith("pooled") and pooled.shape == (1, 64)
    assert logits.shape == (1, 3)
    text = format_trace(steps)
    assert "encoder layer 1 · self-attention" in text and "padding mask" not in text


def test_cli_prints_the_tokens_and_every_step(tok, tmp_path, capsys):
    run = tmp_path / "gpt"
    gpt(tok).save_pretrained(run, extra_files={"tokenizer.json": tok.to_json().encode()})
    assert main(["trace", "--model", str(run), TEXT, "--values", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("input tokens (11): t h e ␣ c a t ␣ s a t")
    assert "scaled by 1/√32 = 0.1768" in out and "(1, 4, 11, 11)" in out
    assert main(["trace", "--model", str(run), TEXT, "--values", "-1"]) == 2
    assert "--values must be 0 or more" in capsys.readouterr().err
