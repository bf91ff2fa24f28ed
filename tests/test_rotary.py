"""Rotary position embedding against Hugging Face Llama's, and inside attention."""

import pytest
import torch

from glassformer import MultiHeadAttention
from glassformer.modules.cache import KVCache
from glassformer.modules.rotary import RotaryEmbedding


@pytest.mark.parametrize("theta", [10000.0, 50000.0])
def test_equals_llama_rotary(theta):
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=32, num_attention_heads=4, rope_theta=theta)
    ref = llama.LlamaRotaryEmbedding(config)
    q, k = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 3]])
    cos, sin = ref(q, positions)
    q_ref, k_ref = llama.apply_rotary_pos_emb(q, k, cos, sin)
    rope = RotaryEmbedding(8, theta=theta)
    torch.testing.assert_close(rope(q, positions), q_ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(rope(k, positions), k_ref, atol=1e-6, rtol=0)


def test_scores_depend_on_the_distance_only():
    rope = RotaryEmbedding(8, theta=100.0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(p, p2):
        return (rope(q, torch.tensor([p])) * rope(k, torch.tensor([p2]))).sum()

    torch.testing.assert_close(score(7, 3), score(104, 100), atol=1e-4, rtol=0)
    assert not torch.allclose(score(7, 3), score(7, 4), atol=1e-3)


def _rotary_attention():
    torch.manual_seed(0)
    return MultiHeadAttention(
        d_model=16, num_heads=4, num_kv_heads=2, causal=True, rotary=RotaryEmbedding(4, 500.0)
    )


def test_cached_decoding_equals_uncached():
    attn = _rotary_attention()
    x = torch.randn(2, 7, 16)
    whole = attn(x).output
    cache = KVCache()
    steps = [attn(x[:, :3], cache=cache).output]
    steps += [attn(x[:, t : t + 1], cache=cache).output for t in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, 1), whole, atol=1e-6, rtol=0)


def test_explicit_positions_shift_a_left_padded_row():
    attn = _rotary_attention()
    x = torch.randn(1, 5, 16)
    padded = torch.cat([torch.randn(1, 2, 16), x], 1)  # two pads, then the same tokens
    mask = torch.tensor([[False, False] + [True] * 5])[:, None, None, :]
    positions = torch.tensor([[0, 0, 0, 1, 2, 3, 4]])
    out = attn(padded, mask=mask, positions=positions).output[:, 2:]
    torch.testing.assert_close(out, attn(x).output, atol=1e-6, rtol=0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="even head_dim, got 5"):
        RotaryEmbedding(5)
    with pytest.raises(ValueError, match="rotary head_dim=8 differs"):
        MultiHeadAttention(d_model=16, num_heads=4, rotary=RotaryEmbedding(8))
