"""The key/value cache: storage that grows and reorders right, and attention, stacks and
models that give the same numbers token by token as over the whole sequence at once."""

import pytest
import torch

from glassformer import GPT, GPTConfig, Seq2SeqConfig, Seq2SeqTransformer
from glassformer.modules import Decoder, Encoder, MultiHeadAttention
from glassformer.modules.cache import DecoderCache, KVCache

TOL = dict(atol=1e-5, rtol=1e-5)


def test_kv_cache_appends_past_its_first_block_and_reorders_rows():
    torch.manual_seed(0)
    cache = KVCache()
    parts_k = [torch.randn(3, 2, n, 4) for n in (5, 1, 70, 1)]  # 77 > the 64-position block
    parts_v = [torch.randn(3, 2, n, 4) for n in (5, 1, 70, 1)]
    for k, v in zip(parts_k, parts_v, strict=True):
        keys, values = cache.append(k, v)
    assert len(cache) == 77
    assert torch.equal(keys, torch.cat(parts_k, dim=2))
    assert torch.equal(values, torch.cat(parts_v, dim=2))
    cache.reorder(torch.tensor([2, 2, 0]))
    assert torch.equal(cache.keys, torch.cat(parts_k, dim=2)[[2, 2, 0]])
    assert torch.equal(cache.values, torch.cat(parts_v, dim=2)[[2, 2, 0]])


def test_an_empty_cache_says_so():
    with pytest.raises(RuntimeError, match="empty"):
        KVCache().keys  # noqa: B018


@pytest.mark.parametrize("need_weights", [False, True])
def test_causal_self_attention_token_by_token_equals_the_whole_sequence(need_weights):
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=32, num_heads=4, causal=True).eval()
    x = torch.randn(2, 9, 32)
    full = mha(x, need_weights=need_weights)
    cache = KVCache()
    # a 4-token prefix in one call, then one token at a time
    pieces = [mha(x[:, :4], cache=cache, need_weights=need_weights)]
    pieces += [mha(x[:, t : t + 1], cache=cache, need_weights=need_weights) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat([p.output for p in pieces], 1), full.output, **TOL)
    if need_weights:
        last = pieces[-1].weights  # (B, H, 1, 9): the last query over every key
        torch.testing.assert_close(last, full.weights[:, :, -1:], **TOL)


def test_cross_attention_projects_the_memory_once():
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=16, num_heads=2).eval()
    memory = torch.randn(2, 7, 16)
    cache = KVCache()
    first = mha(torch.randn(2, 1, 16), memory, cache=cache)
    query = torch.randn(2, 1, 16)
    # Later calls reuse the stored keys/values: even a different memory argument is ignored.
    again = mha(query, torch.zeros_like(memory), cache=cache)
    torch.testing.assert_close(again.output, mha(query, memory).output, **TOL)
    assert len(cache) == 7 and first.output.shape == (2, 1, 16)


def _stack_options(norm_first):
    return dict(d_model=32, num_heads=4, d_ff=64, dropout=0.0, norm_first=norm_first)


@pytest.mark.parametrize("norm_first", [False, True])
def test_causal_encoder_stack_with_a_cache(norm_first):
    torch.manual_seed(0)
    stack = Encoder(num_layers=3, causal=True, **_stack_options(norm_first)).eval()
    x = torch.randn(2, 8, 32)
    cache = DecoderCache(3)
    steps = [stack(x[:, :3], cache=cache).hidden]
    steps += [stack(x[:, t : t + 1], cache=cache).hidden for t in range(3, 8)]
    torch.testing.assert_close(torch.cat(steps, 1), stack(x).hidden, **TOL)
    assert cache.length == 8


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_stack_with_a_cache_and_a_padded_memory(norm_first):
    torch.manual_seed(0)
    stack = Decoder(num_layers=2, **_stack_options(norm_first)).eval()
    x, memory = torch.randn(2, 6, 32), torch.randn(2, 5, 32)
    memory_mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]).bool()[:, None, None, :]
    cache = DecoderCache(2, cross_attention=True)
    steps = [
        stack(x[:, t : t + 1], memory, memory_mask=memory_mask, cache=cache).hidden
        for t in range(6)
    ]
    full = stack(x, memory, memory_mask=memory_mask).hidden
    torch.testing.assert_close(torch.cat(steps, 1), full, **TOL)


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_gpt_logits_with_a_cache_equal_the_full_forward(positional):
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=40, max_len=32, d_model=32, num_heads=4, num_layers=2, positional=positional
    )
    model = GPT(config).eval()
    ids = torch.randint(3, 40, (3, 20))
    full = model(ids).logits
    cache = model.new_cache()
    with torch.no_grad():
        steps = [model(ids[:, :5], cache=cache).logits]
        steps += [model(ids[:, t : t + 1], cache=cache).logits for t in range(5, 20)]
    torch.testing.assert_close(torch.cat(steps, 1), full, **TOL)


def test_gpt_cache_with_left_padding_and_explicit_positions():
    """A left-padded row, given its own positions, matches the same row alone."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, max_len=32, d_model=32, num_heads=4, num_layers=2))
    model.eval()
    alone = torch.tensor([[5, 6, 7, 8, 9, 10]])
    padded = torch.tensor([[0, 0, 5, 6, 7], [3, 4, 5, 6, 7]])
    keep = padded != 0
    positions = (keep.cumsum(1) - 1).clamp(min=0)
    cache = model.new_cache()
    with torch.no_grad():
        model(padded, mask=keep[:, None, None, :], positions=positions, cache=cache)
        keep = torch.cat([keep, torch.ones(2, 1, dtype=torch.bool)], 1)
        step = model(
            torch.tensor([[8], [8]]),
            mask=keep[:, None, None, :],
            positions=torch.tensor([[3], [5]]),
            cache=cache,
        ).logits
        expected = model(alone[:, :4]).logits[:, -1]
    torch.testing.assert_close(step[0, -1:], expected, **TOL)


def test_seq2seq_decode_with_a_cache_equals_the_full_decode():
    torch.manual_seed(0)
    config = Seq2SeqConfig.preset("tiny", src_vocab_size=30, tgt_vocab_size=30, dropout=0.0)
    model = Seq2SeqTransformer(config).eval()
    src = torch.tensor([[5, 6, 7, 0, 0], [8, 9, 10, 11, 12]])
    src_mask = (src != 0)[:, None, None, :]
    tgt = torch.randint(3, 30, (2, 9))
    with torch.no_grad():
        memory = model.encode(src, src_mask).hidden
        full = model.decode(tgt, memory, src_mask).hidden
        cache = model.new_cache()
        steps = [model.decode(tgt[:, :2], memory, src_mask, cache=cache).hidden]
        steps += [
            model.decode(tgt[:, t : t + 1], memory, src_mask, cache=cache).hidden
            for t in range(2, 9)
        ]
    torch.testing.assert_close(torch.cat(steps, 1), full, **TOL)


def test_explicit_positions_are_checked():
    model = GPT(GPTConfig(vocab_size=40, max_len=8, d_model=16, num_heads=2, num_layers=1))
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 8\), got 0..8"):
        model(ids, positions=torch.tensor([[0, 1, 8]]))
    with pytest.raises(ValueError, match=r"positions must be \(batch, length\) = \(1, 3\)"):
        model(ids, positions=torch.tensor([0, 1, 2]))
