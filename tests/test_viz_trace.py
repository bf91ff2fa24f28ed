"""The step-by-step trace: every step is a value the model computed (read at its hook point,
in the order the forward pass reached it), described by what computed it.

This proves the README claim "the trace's shapes and values are the real tensors'": each
step's values are compared here with the same model's ``run_with_cache`` and output.
"""

import pytest
import torch

from glassformer import (
    GPT,
    ClassifierConfig,
    GPTClassifier,
    GPTClassifierConfig,
    GPTConfig,
    Seq2SeqConfig,
    Seq2SeqTransformer,
    TransformerClassifier,
)
from glassformer.cli import main
from glassformer.data.tokenizers import CharTokenizer
from glassformer.models.families import GPTNeoXConfig, Qwen3Config, T5Config
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


def test_every_step_is_the_value_the_model_computed(tok):
    model = gpt(tok)
    steps = trace(model, tok, TEXT, values=6)
    ids = torch.tensor([tok.encode(TEXT)])
    out, cache = model.run_with_cache(ids)
    assert [s.name for s in steps] == list(cache)  # every point, in the order they ran
    for s in steps:
        assert s.shape == tuple(cache[s.name].shape), s.name
        first = cache[s.name].float()
        while first.dim() > 1:
            first = first[0]
        first = first.masked_fill(first == torch.finfo(first.dtype).min, -torch.inf)  # masked
        torch.testing.assert_close(torch.tensor(s.values), first[:6], msg=s.name)
    T, H, D, V = 11, 4, 128, tok.vocab_size
    shapes = {s.what: s.shape for s in steps if s.where == "block 0 · self-attention"}
    assert shapes[f"Q = x·W_q + b_q, in {H} heads of {D // H}"] == (1, T, H, D // H)
    (scores,) = steps_named(steps, "scores")[:1]
    assert scores.shape == (1, H, T, T)
    assert f"{H * T * (T - 1) // 2} of {H * T * T} masked (causal)" in scores.what
    assert scores.values[1:] == [-torch.inf] * 5  # the first query sees only the first key
    assert "[" + ", ".join(f"{x: .4f}" for x in scores.values) + ", …]" in format_trace([scores])
    assert " -inf, -inf" in format_trace([scores])
    (logits,) = steps_named(steps, "logits")
    assert logits.shape == (1, T, V)
    torch.testing.assert_close(torch.tensor(logits.values), out.logits[0, 0, :6])
    softmaxes = steps_named(steps, "softmax over keys")
    assert len(softmaxes) == 2 and all("rows sum to 1.0000..1.0000" in s.what for s in softmaxes)


def test_a_translator_is_traced_encoder_then_decoder_with_cross_attention(tok):
    torch.manual_seed(0)
    v = tok.vocab_size
    model = Seq2SeqTransformer(Seq2SeqConfig.preset("tiny", src_vocab_size=v, tgt_vocab_size=v))
    steps = trace(model.eval(), tok, TEXT, target="el gato")
    places = list(dict.fromkeys(s.where.split(" · ")[0] for s in steps))
    assert places[:3] == ["encoder embedding", "encoder block 0", "encoder block 1"]
    assert "decoder block 0" in places and places[-1] == "output"
    cross = [s for s in steps if s.where == "decoder block 0 · cross-attention"]
    (scores,) = [s for s in cross if s.what.startswith("scores")]
    assert scores.shape == (1, 4, 8, 11)  # <bos> + 7 target characters × 11 source ones
    assert any(s.what.startswith("K = memory·W_k") for s in cross)
    assert any(s.what.startswith("residual sum: x + cross-attention(x)") for s in steps)


def test_modern_gpt_trace_shows_rope_gqa_rmsnorm_swiglu(tok):
    torch.manual_seed(0)
    config = GPTConfig.preset("llama-tiny", vocab_size=tok.vocab_size, num_layers=2)
    steps = trace(GPT(config).eval(), tok, TEXT, values=5)
    whats = [s.what for s in steps]
    assert "Q rotated by position (RoPE, theta=10000)" in whats
    assert "K = x·W_k, in 2 heads of 32, each shared by 2 query heads" in whats
    assert any(w.startswith("ln1: RMSNorm of the stream") for w in whats)
    assert "swiglu: silu(gate) · up" in whats
    assert not any("positions" in w for w in whats)  # rotary adds no position vectors


def test_the_families_parts_are_named_in_the_trace(tok):
    """QK-norm (Qwen3), a partial rotation and parallel blocks (GPT-NeoX) say what they are."""
    torch.manual_seed(0)
    qwen3 = Qwen3Config(vocab_size=tok.vocab_size, d_model=128, num_heads=4, num_kv_heads=2,
                        num_layers=4, d_ff=344, head_dim=16)  # fmt: skip
    whats = [s.what for s in trace(GPT(qwen3).eval(), tok, TEXT)]
    assert "Q normalised per head: RMSNorm over its 16 features (QK-norm)" in whats
    assert "K normalised per head: RMSNorm over its 16 features (QK-norm)" in whats
    neox = GPTNeoXConfig(vocab_size=tok.vocab_size, max_len=64, d_model=128, num_heads=4,
                         num_layers=4, d_ff=512, rotary_dim=8, parallel=True)  # fmt: skip
    whats = [s.what for s in trace(GPT(neox).eval(), tok, TEXT)]
    assert "Q rotated by position (RoPE, theta=10000, its first 8 of 32 features)" in whats
    parallel = "block output: x + self-attention(x) + feed-forward(x), in parallel"
    assert whats.count(parallel) == 4
    t5 = T5Config(src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, d_model=64,
                  num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=256,
                  relative_buckets=8, relative_max_distance=16)  # fmt: skip
    whats = [s.what for s in trace(Seq2SeqTransformer(t5).eval(), tok, TEXT, target="a b")]
    assert ("relative positions: a bias per head on every score, by distance bucket "
            "(8 buckets, keys before and after; T5)") in whats  # fmt: skip
    assert any(w.startswith("scores Q·Kᵀ × 1 + position bias, ") for w in whats)  # decoder


def test_pre_norm_and_one_layer(tok):
    model = gpt(tok)  # GPT blocks are pre-norm
    steps = trace(model, tok, TEXT, layer=2)
    blocks = {s.where.split(" · ")[0] for s in steps if "block" in s.where}
    assert blocks == {"block 1"}
    assert any("before self-attention (pre-norm)" in s.what for s in steps)
    with pytest.raises(ValueError, match="layer must be in 1..2, got 3"):
        trace(model, tok, TEXT, layer=3)


def test_post_norm_steps_say_the_norm_comes_after_the_sum(tok):
    torch.manual_seed(0)
    config = ClassifierConfig.preset("tiny", vocab_size=tok.vocab_size, num_classes=3)
    steps = trace(TransformerClassifier(config).eval(), tok, TEXT)
    assert any(s.what.startswith("ln1: LayerNorm of x + self-attention(x)") for s in steps)
    pooled, logits = steps[-2:]
    assert pooled.what == "pooled: the mean of the real tokens' states (padding ignored)"
    assert pooled.shape == (1, 64) and logits.shape == (1, 3)
    assert "block 0 · self-attention" in format_trace(steps)


def test_a_gpt_shaped_classifier_says_it_reads_the_last_token(tok):
    torch.manual_seed(0)
    config = GPTClassifierConfig.preset("tiny", vocab_size=tok.vocab_size, num_classes=2)
    steps = trace(GPTClassifier(config).eval(), tok, TEXT)
    (pooled,) = steps_named(steps, "pooled")
    assert "last real token" in pooled.what


def test_cli_prints_the_tokens_and_every_step(tok, tmp_path, capsys):
    run = tmp_path / "gpt"
    gpt(tok).save_pretrained(run, extra_files={"tokenizer.json": tok.to_json().encode()})
    assert main(["trace", "--model", str(run), TEXT, "--values", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("input tokens (11): t h e ␣ c a t ␣ s a t")
    assert "scores Q·Kᵀ/√32 (× 0.1768)" in out and "(1, 4, 11, 11)" in out
    assert main(["trace", "--model", str(run), TEXT, "--values", "-1"]) == 2
    assert "--values must be 0 or more" in capsys.readouterr().err
