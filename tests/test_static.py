"""The static decoding path (glassformer.generation.static): the same tokens as the plain
cached path and logits to 1e-5, for the GPT-2 block and the modern one (RoPE, RMSNorm,
SwiGLU, grouped-query attention), post-norm, left-padded batches, sampling and stop
tokens; a cache that refuses to overflow; the plain path wherever the static one cannot
go; and the compiled step (slow: it compiles)."""

import pytest
import torch

from glassformer import GPT, GPTConfig
from glassformer.generation import static as static_module
from glassformer.generation.static import (
    can_decode_statically,
    decode_step,
    static_cache,
    use_whole_buffers,
)
from glassformer.modules.cache import StaticKVCache


def gpt(seed=0, **overrides):
    torch.manual_seed(seed)
    config = dict(vocab_size=50, max_len=48, num_layers=2, tie_weights=False) | overrides
    model = GPT(GPTConfig.preset("tiny", **config)).eval()
    with torch.no_grad():  # spread the logits so greedy continuations vary
        model.embed.weight.mul_(10.0)
        model.lm_head.weight.mul_(8.0)
    return model


MODERN = dict(
    positional="rope",
    norm="rms",
    activation="swiglu",
    num_heads=4,
    num_kv_heads=2,
    bias=False,
    qkv_bias=False,
)
KINDS = {"gpt2": {}, "modern": MODERN, "post-norm": dict(norm_first=False)}


def counting_steps(monkeypatch):
    """Count decode_step calls (so a test knows the static path ran)."""
    calls = []
    real = static_module.decode_step

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr("glassformer.generation.sampling.decode_step", counted)
    return calls


@pytest.mark.parametrize("kind", KINDS)
def test_static_greedy_gives_the_plain_cached_paths_tokens(kind, monkeypatch):
    model = gpt(**KINDS[kind])
    prompt = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10]])
    calls = counting_steps(monkeypatch)
    static = model.generate(prompt, 30)
    assert len(calls) == 29  # the prompt's logits come from the forward, then 29 steps
    plain = model.generate(prompt, 30, static_cache=False)
    assert torch.equal(static, plain)
    assert len(set(static[:, 4:].flatten().tolist())) > 5


@pytest.mark.parametrize("kind", KINDS)
def test_the_step_gives_the_forwards_logits_to_1e_5(kind):
    model = gpt(**KINDS[kind])
    ids = torch.randint(1, 50, (2, 20))
    with torch.no_grad():
        full = model(ids).logits  # (2, 20, V): every position's logits, no cache
        cache = static_cache(model, 2, 20)
        first = model(ids[:, :8], cache=cache, logits_to_keep=1).logits[:, -1]
        torch.testing.assert_close(first, full[:, 7], atol=1e-5, rtol=0)
        use_whole_buffers(cache)  # the compiled step's shapes: every step the whole cache
        filled = torch.zeros(2, 1, 1, 20, dtype=torch.bool)
        filled[..., :8] = True
        for t in range(8, 20):
            filled[..., t] = True
            position = torch.full((2, 1), t)
            logits = decode_step(model, ids[:, t : t + 1], position, filled, cache)
            torch.testing.assert_close(logits, full[:, t], atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["gpt2", "modern"])
def test_a_left_padded_batch_decodes_each_row_as_alone(kind):
    model = gpt(pad_id=0, **KINDS[kind])
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12]]
    padded = torch.tensor([prompts[0], [0, 0, 0, 0, *prompts[1]]])
    together = model.generate(padded, 12)
    for row, prompt in enumerate(prompts):
        alone = model.generate(torch.tensor([prompt]), 12)
        assert together[row, -12:].tolist() == alone[0, -12:].tolist()
    assert torch.equal(together, model.generate(padded, 12, static_cache=False))


def test_sampling_with_stop_tokens_matches_the_plain_path_under_a_seed():
    model = gpt()
    prompt = torch.tensor([[3, 4, 5], [6, 7, 8]])
    options = dict(do_sample=True, top_k=10, temperature=1.3, eos_id=[4, 9])
    runs = []
    for static in (True, False):
        generator = torch.Generator().manual_seed(7)
        runs.append(model.generate(prompt, 25, generator=generator, static_cache=static, **options))
    assert torch.equal(runs[0], runs[1])


def test_the_static_cache_refuses_more_positions_than_it_holds():
    cache = StaticKVCache(1, 2, 4, 8, dtype=torch.float32, device="cpu")
    cache.append(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8))
    keys, _ = cache.append(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8))
    assert keys.shape == (1, 2, 4, 8)
    with pytest.raises(ValueError, match="holds 4 positions; 4 are filled and 1 more came"):
        cache.append(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8))


def test_models_the_static_path_cannot_take_fall_back_to_the_plain_one(monkeypatch):
    windowed = gpt(attention_window=4)
    assert "rolling cache" in can_decode_statically(windowed)
    hooked = gpt()
    seen = []
    with hooked.hooks([("blocks.0.hook_resid_pre", lambda x, name: seen.append(x))]):
        assert "hooks" in can_decode_statically(hooked)
        calls = counting_steps(monkeypatch)
        hooked.generate(torch.tensor([[3, 4]]), 5)
    assert not calls and len(seen) == 5  # every step went through the hooks
    long = gpt()  # past max_len the context slides: the plain path, the same as before
    prompt = torch.tensor([[3, 4, 5]])
    assert torch.equal(long.generate(prompt, 50), long.generate(prompt, 50, static_cache=False))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpt2", "modern"])
def test_the_compiled_step_gives_the_plain_paths_tokens_and_logits(kind):
    model = gpt(**KINDS[kind])
    prompt = torch.tensor([[3, 4, 5, 6]])
    compiled = model.generate(prompt, 30, compile=True)
    assert torch.equal(compiled, model.generate(prompt, 30, static_cache=False))
    ids = torch.randint(1, 50, (1, 12))
    with torch.no_grad():
        full = model(ids).logits
        cache = static_cache(model, 1, 12)
        model(ids[:, :11], cache=cache)
        use_whole_buffers(cache)
        filled = torch.ones(1, 1, 1, 12, dtype=torch.bool)
        step = static_module.compiled_step(model)
        logits = step(model, ids[:, 11:], torch.tensor([[11]]), filled, cache)
    torch.testing.assert_close(logits, full[:, 11], atol=1e-5, rtol=0)
