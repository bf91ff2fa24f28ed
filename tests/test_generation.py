"""Generation: greedy equals a hand-written loop, sampling is reproducible, follows the
distribution it claims and stays inside top-k / top-p, stop tokens, the translator's
greedy decoding and beam search, and GenerationConfig (checked values, the same tokens as
the keywords it stands for)."""

import ast
import dataclasses
import json
from pathlib import Path

import pytest
import torch

import glassformer
from glassformer import GPT, GenerationConfig, GPTConfig, Seq2SeqConfig, Seq2SeqTransformer
from glassformer.generation import choose_next


def tiny_gpt(seed=0, **overrides):
    torch.manual_seed(seed)
    config = dict(vocab_size=30, max_len=16, num_layers=2, tie_weights=False) | overrides
    model = GPT(GPTConfig.preset("tiny", **config)).eval()
    with torch.no_grad():
        # GPT-2's 0.02 init gives near-uniform logits (and, tied, a copy of the last token);
        # spread them so greedy and sampled continuations vary.
        model.embed.weight.mul_(10.0)
        model.lm_head.weight.mul_(8.0)
    return model


def greedy_by_hand(model, ids, steps):
    with torch.no_grad():
        for _ in range(steps):
            next_id = model(ids[:, -model.config.max_len :]).logits[:, -1].argmax(-1)
            ids = torch.cat([ids, next_id[:, None]], dim=1)
    return ids


# ---- GPT ---------------------------------------------------------------------------------


def test_greedy_equals_a_hand_written_argmax_loop():
    model = tiny_gpt()
    prompt = torch.tensor([[3, 4, 5], [6, 7, 8]])
    out = model.generate(prompt, 8)
    assert out.shape == (2, 3 + 8)
    assert torch.equal(out[:, :3], prompt)
    assert torch.equal(out, greedy_by_hand(model, prompt, 8))
    assert len(set(out[:, 3:].flatten().tolist())) > 4  # not one token over and over


def test_greedy_past_max_len_crops_the_context():
    model = tiny_gpt()
    prompt = torch.tensor([[3, 4, 5], [6, 7, 8]])
    out = model.generate(prompt, 20)  # 23 > max_len=16: the context is the last 16
    assert out.shape == (2, 23)
    assert torch.equal(out, greedy_by_hand(model, prompt, 20))


def test_generate_leaves_a_training_model_in_training_mode_and_ignores_dropout():
    model = tiny_gpt(dropout=0.5)
    prompt = torch.tensor([[3, 4, 5]])
    expected = greedy_by_hand(model, prompt, 6)
    model.train()
    assert torch.equal(model.generate(prompt, 6), expected)
    assert model.training


def test_sampling_is_reproducible_with_a_seed():
    model = tiny_gpt()
    prompt = torch.tensor([[3, 4, 5], [9, 9, 9]])

    def sample(seed, **kwargs):
        g = torch.Generator().manual_seed(seed)
        return model.generate(prompt, 10, do_sample=True, generator=g, **kwargs)

    first = sample(1)
    assert torch.equal(first[:, :3], prompt)
    assert torch.equal(sample(1), first)
    assert not torch.equal(sample(2), first)
    assert torch.equal(sample(3, top_k=5, top_p=0.9), sample(3, top_k=5, top_p=0.9))


def test_top_k_1_is_greedy():
    model = tiny_gpt()
    prompt = torch.tensor([[3, 4, 5], [6, 7, 8]])
    g = torch.Generator().manual_seed(0)
    sampled = model.generate(prompt, 10, do_sample=True, top_k=1, temperature=2.0, generator=g)
    assert torch.equal(sampled, model.generate(prompt, 10))


def test_eos_stops_generation_when_every_row_has_emitted_it():
    model = tiny_gpt()
    with torch.no_grad():
        model.lm_head.weight.zero_()  # all logits equal except by the bias below...
        model.lm_head.bias = torch.nn.Parameter(torch.zeros(30))
        model.lm_head.bias[7] = 5.0  # ...so token 7 always wins
    out = model.generate(torch.tensor([[3, 4], [5, 6]]), 10, eos_id=7)
    assert out.tolist() == [[3, 4, 7], [5, 6, 7]]
    assert model.generate(torch.tensor([[3, 4]]), 3).tolist() == [[3, 4, 7, 7, 7]]


def test_eos_pads_finished_rows_while_the_others_go_on():
    model = tiny_gpt()
    prompt = torch.tensor([[3, 4, 5], [6, 7, 8]])
    free = model.generate(prompt, 8)
    row0, row1 = free[0, 3:].tolist(), free[1, 3:].tolist()
    # a token row 0 emits before row 1 does (or that row 1 never emits)
    candidates = [t for t in row0 if t not in row1[: row0.index(t) + 1] and t != 0]
    assert candidates, "no usable stop token for this seed"
    eos = candidates[0]
    out = model.generate(prompt, 8, eos_id=eos)
    stop0 = row0.index(eos)
    stop1 = row1.index(eos) if eos in row1 else 7
    assert out.shape == (2, 3 + max(stop0, stop1) + 1)
    assert out[0, 3:].tolist() == row0[: stop0 + 1] + [0] * (out.size(1) - 4 - stop0)
    assert out[1, 3:].tolist() == row1[: out.size(1) - 3]


def test_sampling_options_are_checked_through_generate():
    with pytest.raises(ValueError, match="top_p must be in"):
        tiny_gpt().generate(torch.tensor([[3]]), 2, do_sample=True, top_p=0.0)


# ---- choose_next -------------------------------------------------------------------------


def test_choose_next_greedy_is_argmax():
    logits = torch.randn(16, 40, generator=torch.Generator().manual_seed(0))
    assert torch.equal(choose_next(logits), logits.argmax(-1))


def test_choose_next_never_leaves_the_top_k_or_the_nucleus():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=g) * 2
    allowed_k = logits.topk(5, dim=-1).indices
    probs = logits.softmax(-1)
    seen_k, seen_p = set(), set()
    for _ in range(50):
        picked = choose_next(logits, do_sample=True, top_k=5, generator=g)
        assert (allowed_k == picked[:, None]).any(-1).all()
        seen_k |= set(zip(range(64), picked.tolist(), strict=True))
        picked = choose_next(logits, do_sample=True, top_p=0.5, generator=g)
        # the nucleus: tokens whose more likely predecessors sum to less than 0.5
        p_picked = probs.gather(1, picked[:, None])
        mass_above = (probs * (probs > p_picked)).sum(-1)
        assert (mass_above < 0.5).all()
        seen_p |= set(zip(range(64), picked.tolist(), strict=True))
        picked = choose_next(logits, do_sample=True, top_k=5, top_p=0.5, generator=g)
        assert (allowed_k == picked[:, None]).any(-1).all()
        assert ((probs * (probs > probs.gather(1, picked[:, None]))).sum(-1) < 0.5).all()
    # really sampling: more than one token per row came up
    assert len(seen_k) > 64 * 2 and len(seen_p) > 64


def _frequencies(logits, n=40_000, **kwargs):
    g = torch.Generator().manual_seed(0)
    picked = choose_next(logits.expand(n, -1), do_sample=True, generator=g, **kwargs)
    return torch.bincount(picked, minlength=logits.size(-1)).float() / n


LOGITS = torch.tensor([[2.0, 1.5, 1.0, 0.0, -1.0, -3.0]])


def test_sampling_follows_the_softmax_with_temperature():
    for temperature in (1.0, 0.5, 2.0):
        expected = (LOGITS[0] / temperature).softmax(-1)
        got = _frequencies(LOGITS, temperature=temperature)
        torch.testing.assert_close(got, expected, atol=0.01, rtol=0)


def test_top_k_renormalises_over_the_k_largest():
    got = _frequencies(LOGITS, top_k=3)
    expected = torch.zeros(6)
    expected[:3] = LOGITS[0, :3].softmax(-1)
    torch.testing.assert_close(got, expected, atol=0.01, rtol=0)


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = LOGITS[0].softmax(-1)  # [0.47, 0.29, 0.17, 0.06, 0.02, 0.003]
    assert probs[:2].sum() < 0.8 <= probs[:3].sum()
    got = _frequencies(LOGITS, top_p=0.8)
    expected = torch.zeros(6)
    expected[:3] = probs[:3] / probs[:3].sum()
    torch.testing.assert_close(got, expected, atol=0.01, rtol=0)
    # top_p below the first token's probability keeps just that token
    assert torch.equal(_frequencies(LOGITS, n=200, top_p=0.3), torch.eye(6)[0])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=0.0), "temperature must be > 0 when sampling, got 0.0"),
        (dict(temperature=-1.5), "temperature .*-1.5"),
        (dict(temperature=float("nan")), "temperature .*nan"),
        (dict(top_k=0), "top_k must be a positive integer, got 0"),
        (dict(top_k=-3), "top_k .*-3"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\], got 1.5"),
        (dict(top_p=0.0), r"top_p .*got 0.0"),
        (dict(top_p=-0.2), r"top_p .*-0.2"),
    ],
)
def test_bad_sampling_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        choose_next(torch.randn(2, 10), do_sample=True, **kwargs)


# ---- the translator ----------------------------------------------------------------------


def tiny_translator(seed=0):
    torch.manual_seed(seed)
    config = Seq2SeqConfig.preset(
        "tiny", src_vocab_size=12, tgt_vocab_size=12, dropout=0.0, max_len=12
    )
    return Seq2SeqTransformer(config).eval()


def test_translator_greedy_equals_a_full_forward_loop():
    model = tiny_translator(seed=3)
    src = torch.tensor([[3, 4, 5, 6], [7, 8, 0, 0]])
    out = model.generate(src, 6)
    assert (out[:, 0] == model.config.bos_id).all()
    ys = torch.ones(2, 1, dtype=torch.long)
    finished = torch.zeros(2, dtype=torch.bool)
    with torch.no_grad():
        for _ in range(6):
            logits = model(src, ys).logits[:, -1]
            logits[:, [0, 1]] = float("-inf")  # never pad or bos
            next_id = logits.argmax(-1)
            next_id = next_id.masked_fill(finished, 0)
            finished |= next_id == model.config.eos_id
            ys = torch.cat([ys, next_id[:, None]], dim=1)
            if finished.all():
                break
    assert torch.equal(out, ys)


def test_translator_learns_to_copy_and_decodes_greedily():
    model = tiny_translator()
    src = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 0], [10, 11, 3, 4], [5, 5, 0, 0]])
    lengths = (4, 3, 4, 2)
    labels = torch.cat([src, torch.zeros(4, 1, dtype=torch.long)], 1)
    for i, n in enumerate(lengths):
        labels[i, n] = 2  # eos after the copy
    tgt_in = torch.cat([torch.ones(4, 1, dtype=torch.long), labels[:, :-1]], 1)  # bos first
    tgt_in[tgt_in == 2] = 0
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(300):
        loss = model(src, tgt_in, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.01:
            break
    assert loss.item() < 0.01
    out = model.generate(src, 8)
    assert model.training  # generate restores the mode it found
    assert (out[:, 0] == 1).all()
    assert out.size(1) == max(lengths) + 2  # stopped once every row had emitted eos
    for i, n in enumerate(lengths):
        assert out[i, 1 : n + 2].tolist() == src[i, :n].tolist() + [2]  # the copy, then EOS
        assert (out[i, n + 2 :] == 0).all()  # finished rows are padded


# ---- the KV cache in generation ----------------------------------------------------------


@pytest.mark.parametrize("steps", [1, 5, 12, 20])  # 20 crosses max_len=16
def test_gpt_cached_and_uncached_greedy_give_the_same_tokens(steps):
    model = tiny_gpt(positional="sinusoidal") if steps == 12 else tiny_gpt()
    prompt = torch.tensor([[0, 0, 3, 4, 5], [6, 7, 8, 9, 10], [0, 11, 12, 13, 14]])  # left pads
    cached = model.generate(prompt, steps, use_cache=True)
    assert torch.equal(cached, model.generate(prompt, steps, use_cache=False))
    assert cached.shape == (3, 5 + steps)


def test_gpt_cached_and_uncached_sampling_agree_under_a_seed():
    model = tiny_gpt()
    prompt = torch.tensor([[3, 4, 5], [6, 7, 8]])

    def sample(use_cache):
        g = torch.Generator().manual_seed(7)
        kwargs = dict(do_sample=True, top_k=10, top_p=0.9, temperature=1.3)
        return model.generate(prompt, 12, generator=g, use_cache=use_cache, **kwargs)

    assert torch.equal(sample(True), sample(False))


def test_a_padded_batch_generates_what_each_prompt_generates_alone():
    model = tiny_gpt()
    prompts = [[3, 4, 5, 6], [7, 8], [9, 10, 11]]
    alone = [model.generate(torch.tensor([p]), 6)[0, len(p) :].tolist() for p in prompts]
    right = torch.tensor([p + [0] * (4 - len(p)) for p in prompts])
    left = torch.tensor([[0] * (4 - len(p)) + p for p in prompts])
    for batch in (right, left):
        for use_cache in (True, False):
            out = model.generate(batch, 6, use_cache=use_cache)
            assert out[:, 4:].tolist() == alone
    # the result is left-padded: each prompt ends where its continuation begins
    assert model.generate(right, 6)[:, :4].tolist() == left.tolist()


def test_attention_mask_describes_padding_for_a_model_without_pad_id():
    model = tiny_gpt(pad_id=None)
    alone = model.generate(torch.tensor([[7, 8]]), 5)[0, 2:]
    batch = torch.tensor([[7, 8, 29, 29], [3, 4, 5, 6]])  # 29s are filler, not tokens
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    out = model.generate(batch, 5, attention_mask=mask)
    assert torch.equal(out[0, 4:], alone)
    with pytest.raises(
        ValueError, match=r"attention_mask must have the ids' shape \(2, 4\), got \(2, 3\)"
    ):
        model.generate(batch, 5, attention_mask=mask[:, :3])
    with pytest.raises(ValueError, match="prompt row 0 has no tokens"):
        model.generate(batch, 5, attention_mask=torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1]]))
    with pytest.raises(ValueError, match=r"attention_mask must hold only 1 .* and 0 .*, got 2"):
        model.generate(batch, 5, attention_mask=mask * 2)


def test_several_stop_tokens_and_the_streamer():
    model = tiny_gpt()
    prompt = torch.tensor([[3, 4, 5], [6, 7, 8]])
    free = model.generate(prompt, 10)
    stops = [free[0, 5].item(), free[1, 4].item()]
    seen = []
    out = model.generate(prompt, 10, eos_id=stops, streamer=seen.append)
    for row in out[:, 3:].tolist():
        first = next(i for i, t in enumerate(row) if t in stops)
        assert all(t == 0 for t in row[first + 1 :])  # pads after the stop
    assert torch.equal(torch.stack(seen, 1), out[:, 3:])  # streamed column by column


def test_repetition_penalty_follows_the_ctrl_rule():
    from glassformer.generation import apply_repetition_penalty

    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    ids = torch.tensor([[0, 1, 1, 2]])
    keep = torch.tensor([[True, True, True, False]])  # the 2 is padding: not seen
    out = apply_repetition_penalty(logits, ids, 2.0, keep)
    assert out.tolist() == [[1.0, -2.0, 0.5, 3.0]]
    assert torch.equal(apply_repetition_penalty(logits, ids, 1.0), logits)
    with pytest.raises(ValueError, match="repetition_penalty must be > 0, got 0.0"):
        apply_repetition_penalty(logits, ids, 0.0)


def test_a_strong_repetition_penalty_stops_greedy_repeats():
    model = tiny_gpt()
    prompt = torch.tensor([[3, 4, 5]])
    plain = model.generate(prompt, 12)[0].tolist()
    assert len(set(plain)) < len(plain)  # this model repeats itself...
    penalised = model.generate(prompt, 12, repetition_penalty=1e4)[0].tolist()
    assert len(set(penalised)) == len(penalised)  # ...and with the penalty it does not


def test_choose_next_stays_in_top_k_and_top_p_for_any_logits():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=150, deadline=None)
    @given(
        logits=st.lists(st.floats(-30, 30, allow_nan=False, width=32), min_size=2, max_size=40),
        top_k=st.one_of(st.none(), st.integers(1, 45)),
        top_p=st.one_of(st.none(), st.floats(0.01, 1.0)),
        temperature=st.floats(0.05, 5.0),
        seed=st.integers(0, 2**16),
    )
    def check(logits, top_k, top_p, temperature, seed):
        x = torch.tensor([logits]).expand(256, -1)  # 256 draws: rare tokens come up too
        g = torch.Generator().manual_seed(seed)
        picks = choose_next(
            x, do_sample=True, top_k=top_k, top_p=top_p, temperature=temperature, generator=g
        )
        scaled = x[0] / temperature
        probs = scaled.softmax(-1)
        for picked in set(picks.tolist()):
            if top_k is not None:  # never below the k-th largest logit
                assert scaled[picked] >= scaled.topk(min(top_k, len(logits))).values[-1]
            if top_p is not None:  # the tokens strictly more likely hold less than top_p
                assert probs[probs > probs[picked]].sum() < top_p + 1e-6

    check()


# ---- the translator: cache and beam search -----------------------------------------------


def _sequence_log_prob(model, src, out):
    """Sum of log p(token) over each row's tokens after bos, up to and including eos."""
    c = model.config
    with torch.no_grad():
        logp = model(src, out[:, :-1]).logits.log_softmax(-1)
    picked = logp.gather(-1, out[:, 1:, None]).squeeze(-1)  # (B, T-1)
    real = out[:, 1:] != c.pad_id
    return (picked * real).sum(-1)


def test_translator_cached_and_uncached_agree_greedy_and_beam():
    model = tiny_translator(seed=5)
    src = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 0, 0, 0], [10, 3, 3, 0, 0]])
    for kwargs in (dict(), dict(beam_size=3), dict(beam_size=4, length_penalty=0.0)):
        cached = model.generate(src, 10, **kwargs)
        assert torch.equal(cached, model.generate(src, 10, use_cache=False, **kwargs))


def test_beam_search_with_one_beam_is_greedy():
    from glassformer.generation import beam_search

    for seed in range(4):
        model = tiny_translator(seed=seed)
        src = torch.tensor([[3, 4, 5, 6], [7, 8, 0, 0], [9, 9, 9, 0]])
        mask = (src != 0)[:, None, None, :]
        with torch.no_grad():
            memory = model.encode(src, mask).hidden
            beam = beam_search(model, memory, mask, 10, beam_size=1, keep_greedy=False)
        assert torch.equal(beam, model.generate(src, 10))


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_a_wider_beam_never_scores_below_greedy(length_penalty):
    """Scored independently by a teacher-forced forward pass (log p / length ** penalty),
    beam 4's translation is never less likely than greedy's, and often more."""
    from glassformer.generation import beam_search

    wins = losses_without_guard = 0
    for seed in range(8):
        model = tiny_translator(seed=seed)
        torch.manual_seed(100 + seed)
        src = torch.randint(3, 12, (16, 6))

        def score(out, model=model, src=src):
            length = (out[:, 1:] != model.config.pad_id).sum(1).clamp(min=1)
            return _sequence_log_prob(model, src, out) / length**length_penalty

        greedy = score(model.generate(src, 10))
        beam = score(model.generate(src, 10, beam_size=4, length_penalty=length_penalty))
        assert (beam >= greedy - 1e-5).all()
        wins += int((beam > greedy + 1e-5).sum())
        with torch.no_grad():
            memory = model.encode(src).hidden
            bare = beam_search(
                model,
                memory,
                None,
                10,
                beam_size=4,
                length_penalty=length_penalty,
                keep_greedy=False,
            )
        losses_without_guard += int((score(bare) < greedy - 1e-5).sum())
    assert wins > 20  # it finds translations the model prefers to greedy's
    assert losses_without_guard > 0  # the guard is needed: plain beam search can lose


def test_beam_search_options_are_checked():
    model = tiny_translator()
    src = torch.tensor([[3, 4]])
    with pytest.raises(ValueError, match="beam_size must be a positive integer, got 0"):
        model.generate(src, 5, beam_size=0)
    with pytest.raises(ValueError, match="beam search does not sample"):
        model.generate(src, 5, beam_size=2, do_sample=True)


# ---- GenerationConfig --------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(do_sample=True, temperature=0.0), "temperature must be > 0 when sampling, got 0.0"),
        (dict(do_sample=True, temperature=float("inf")), "temperature .*got inf"),
        (dict(do_sample=True, top_k=0), "top_k must be a positive integer, got 0"),
        (dict(do_sample=True, top_k=2.5), "top_k must be a positive integer, got 2.5"),
        (dict(do_sample=True, top_p=1.5), r"top_p must be in \(0, 1\], got 1.5"),
        (dict(repetition_penalty=0.0), "repetition_penalty must be > 0, got 0.0"),
        (dict(repetition_penalty=float("nan")), "repetition_penalty must be > 0, got nan"),
        (dict(beam_size=0), "beam_size must be a positive integer, got 0"),
        (dict(beam_size=2.0), "beam_size must be a positive integer, got 2.0"),
        (dict(beam_size=3, do_sample=True), "beam search does not sample"),
        (dict(length_penalty=float("nan")), "length_penalty must be a finite number, got nan"),
        (dict(eos_id=-1), r"eos_id must be a token id \(an int >= 0\).*got -1"),
        (dict(eos_id=[3, "."]), r"eos_id must be .*got \[3, '\.'\]"),
        (dict(eos_id="."), r"eos_id must be .*got '\.'"),
        (dict(do_sample="yes"), "do_sample must be True or False, got 'yes'"),
        (dict(early_stopping=1), "early_stopping must be True or False, got 1"),
        (dict(use_cache=None), "use_cache must be True or False, got None"),
    ],
)
def test_generation_config_refuses_each_bad_value(options, message):
    with pytest.raises(ValueError, match=message):
        GenerationConfig(**options)


def test_generation_config_is_frozen_keyword_only_and_rechecked_on_replace():
    config = GenerationConfig(temperature=0.0, top_k=0)  # unused while greedy: allowed
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.top_k = 5
    with pytest.raises(TypeError):
        GenerationConfig(True)  # keyword-only
    with pytest.raises(ValueError, match="temperature must be > 0 when sampling, got 0.0"):
        dataclasses.replace(config, do_sample=True)
    stops = GenerationConfig(eos_id=[4, 7])
    assert stops.eos_id == (4, 7) and hash(stops) == hash(GenerationConfig(eos_id=(4, 7)))
    assert glassformer.GenerationConfig is glassformer.generation.GenerationConfig
    assert "GenerationConfig" in glassformer.__all__


def test_a_config_gives_the_tokens_of_the_same_keywords_for_gpt():
    model = tiny_gpt()
    prompt = torch.tensor([[0, 3, 4, 5], [6, 7, 8, 9]])
    greedy = dict(repetition_penalty=1.3, eos_id=[11, 12])
    sampled = dict(do_sample=True, temperature=1.4, top_k=12, top_p=0.9, eos_id=11)
    for options in (greedy, sampled, dict(sampled, use_cache=False)):
        config = GenerationConfig(**options)
        by_keywords = model.generate(
            prompt, 10, generator=torch.Generator().manual_seed(3), **options
        )
        by_config = model.generate(
            prompt, 10, generator=torch.Generator().manual_seed(3), generation_config=config
        )
        assert torch.equal(by_config, by_keywords)
    # the sampled run really differs from greedy (else the comparison above proves little)
    assert not torch.equal(
        model.generate(prompt, 10, generator=torch.Generator().manual_seed(3), **sampled),
        model.generate(prompt, 10, eos_id=11),
    )


def test_a_config_gives_the_tokens_of_the_same_keywords_for_the_translator():
    model = tiny_translator(seed=5)
    src = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 0, 0, 0], [10, 3, 3, 0, 0]])
    beam = dict(beam_size=4, length_penalty=0.6, early_stopping=False)
    sampled = dict(do_sample=True, temperature=1.2, top_p=0.95, repetition_penalty=1.2)

    def translate(**options):
        return model.generate(src, 10, generator=torch.Generator().manual_seed(2), **options)

    for options in (dict(repetition_penalty=2.0), beam, dict(beam, use_cache=False), sampled):
        by_config = translate(generation_config=GenerationConfig(**options))
        assert torch.equal(by_config, translate(**options))
    # each of them decodes differently from plain greedy
    for options in (dict(repetition_penalty=2.0), beam, sampled):
        assert not torch.equal(translate(**options), translate())


def test_keywords_override_the_config_fields():
    model = tiny_gpt()
    prompt = torch.tensor([[3, 4, 5], [6, 7, 8]])
    config = GenerationConfig(do_sample=True, top_k=5, eos_id=7)
    g = torch.Generator().manual_seed(0)
    out = model.generate(prompt, 8, generation_config=config, do_sample=False, generator=g)
    assert torch.equal(out, model.generate(prompt, 8, eos_id=7))  # greedy, still eos 7
    assert config.do_sample  # the config itself is unchanged
    # an override is checked like any field
    with pytest.raises(ValueError, match="top_k must be a positive integer, got 0"):
        model.generate(prompt, 8, generation_config=config, top_k=0)

    translator = tiny_translator(seed=2)
    src = torch.tensor([[3, 4, 5, 6], [7, 8, 0, 0]])
    wide = GenerationConfig(beam_size=4, length_penalty=0.0)
    assert torch.equal(
        translator.generate(src, 8, generation_config=wide, beam_size=1),
        translator.generate(src, 8),
    )
    assert torch.equal(
        translator.generate(src, 8, generation_config=wide, length_penalty=1.0),
        translator.generate(src, 8, beam_size=4),
    )


def test_an_unknown_option_is_one_error_that_lists_the_known_ones():
    prompt = torch.tensor([[3, 4, 5]])
    with pytest.raises(TypeError, match="unknown generation option 'topk'; the options are: ") as e:
        tiny_gpt().generate(prompt, 3, topk=5)
    assert "top_k" in str(e.value) and "attention_mask" in str(e.value)
    with pytest.raises(TypeError, match="unknown generation option 'beam'") as e:
        tiny_translator().generate(torch.tensor([[3, 4]]), 3, beam=4)
    assert "beam_size" in str(e.value) and "src_mask" in str(e.value)
    with pytest.raises(TypeError, match="generation_config must be a GenerationConfig, got dict"):
        tiny_gpt().generate(prompt, 3, generation_config=dict(do_sample=True))


def test_options_a_model_cannot_use_are_refused():
    with pytest.raises(ValueError, match="a GPT decodes with beam_size=1, got 4"):
        tiny_gpt().generate(torch.tensor([[3, 4]]), 3, beam_size=4)
    with pytest.raises(
        ValueError, match="stops at its config's eos_id \\(2\\); eos_id must be None"
    ):
        tiny_translator().generate(torch.tensor([[3, 4]]), 3, eos_id=5)


def test_translate_texts_takes_a_config_or_keywords():
    from glassformer.data.tokenizers import CharTokenizer
    from glassformer.training.evaluation import translate_texts

    tok = CharTokenizer("abcdefgh")
    model = tiny_translator(seed=4)
    assert tok.vocab_size == model.config.tgt_vocab_size
    texts = ["abc", "hgfe", "d"]
    by_keywords = translate_texts(model, tok, texts, beam_size=3, length_penalty=0.0)
    config = GenerationConfig(beam_size=3, length_penalty=0.0)
    assert translate_texts(model, tok, texts, generation_config=config) == by_keywords


def test_generation_imports_no_higher_layer():
    """generation sits under the models (GPT.generate calls it): it must not import them,
    nor training, the CLI, interop or viz."""
    package = Path(glassformer.generation.__file__).parent
    higher = ("models", "training", "cli", "interop", "viz", "keras")
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                assert not name.startswith(tuple(f"glassformer.{h}" for h in higher)), (
                    f"{path.name} imports {name}"
                )


def test_logits_to_keep_gives_the_last_positions_logits_only():
    """Generation asks for the last position's logits alone after a prompt (the vocabulary
    head is the largest matmul of a step): they equal the full forward's last row."""
    from glassformer import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, max_len=16, d_model=32, num_heads=4, num_layers=2)).eval()
    ids = torch.randint(1, 50, (3, 9))
    full = model(ids).logits
    last = model(ids, logits_to_keep=1).logits
    assert last.shape == (3, 1, 50)
    torch.testing.assert_close(last, full[:, -1:], atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="logits_to_keep leaves out logits that labels score"):
        model(ids, labels=ids, logits_to_keep=1)


# ---- models that are hard to decode: a padded vocabulary, logits that are not finite -------


def padded_qwen2(folder, chat_bpe, padding=64):
    """A random Qwen2 directory (config.json and model.safetensors as Hugging Face writes
    them) whose embedding has ``padding`` rows past its tokenizer's 259 tokens, as Qwen2's
    and Pythia's checkpoints have, those rows' logits made the largest: a decoder that does
    not rule them out picks them. With a chat template."""
    from safetensors.torch import save_file

    from glassformer.data.tokenizers import load_tokenizer

    tokens = load_tokenizer(chat_bpe(folder)).vocab_size
    V, D, F, heads, kv, Dh = tokens + padding, 32, 64, 4, 2, 8
    config = dict(
        model_type="qwen2", architectures=["Qwen2ForCausalLM"], vocab_size=V, hidden_size=D,
        intermediate_size=F, num_hidden_layers=2, num_attention_heads=heads,
        num_key_value_heads=kv, max_position_embeddings=256, rms_norm_eps=1e-6,
        rope_theta=10000.0, hidden_act="silu", tie_word_embeddings=False,
    )  # fmt: skip
    per_layer = {
        "input_layernorm.weight": (D,), "post_attention_layernorm.weight": (D,),
        "self_attn.q_proj.weight": (heads * Dh, D), "self_attn.q_proj.bias": (heads * Dh,),
        "self_attn.k_proj.weight": (kv * Dh, D), "self_attn.k_proj.bias": (kv * Dh,),
        "self_attn.v_proj.weight": (kv * Dh, D), "self_attn.v_proj.bias": (kv * Dh,),
        "self_attn.o_proj.weight": (D, heads * Dh), "mlp.gate_proj.weight": (F, D),
        "mlp.up_proj.weight": (F, D), "mlp.down_proj.weight": (D, F),
    }  # fmt: skip
    shapes = {
        "model.embed_tokens.weight": (V, D),
        "model.norm.weight": (D,),
        "lm_head.weight": (V, D),
    }
    shapes |= {f"model.layers.{i}.{name}": s for i in range(2) for name, s in per_layer.items()}
    g = torch.Generator().manual_seed(0)
    weights = {
        name: 1.0 + 0.2 * torch.randn(shape, generator=g)
        if name.endswith("norm.weight")
        else 0.1 * torch.randn(shape, generator=g)
        for name, shape in shapes.items()
    }
    weights["lm_head.weight"][tokens:] *= 1000.0  # the padded ids win every arg-max
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config))
    template = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return folder, tokens


@pytest.mark.parametrize("options", [{}, {"do_sample": True, "temperature": 1.0}])
def test_ids_past_the_tokenizer_of_a_padded_vocabulary_are_never_chosen(
    chat_bpe, tmp_path, options
):
    from glassformer.inference import load_run

    folder, tokens = padded_qwen2(tmp_path, chat_bpe)
    model, tok = load_run(folder, kind="gpt")
    assert model.config.vocab_size == tokens + 64 and tok.vocab_size == tokens
    prompt = torch.tensor([tok.encode("Hello there")])
    g = torch.Generator().manual_seed(0)
    unlimited = model.generate(prompt, 30, generator=g, **options)
    assert (unlimited[0, prompt.size(1) :] >= tokens).any()  # the trap: padded ids win
    out = model.generate(prompt, 30, vocab_limit=tok.vocab_size, generator=g, **options)
    assert out.shape == (1, prompt.size(1) + 30)  # to the end
    assert (out < tokens).all() and isinstance(tok.decode(out[0]), str)


def test_a_translator_and_its_beams_keep_inside_the_vocab_limit():
    model = tiny_translator()
    src = torch.tensor([[3, 4, 5, 6], [7, 8, 0, 0]])
    for options in ({}, {"beam_size": 3}, {"do_sample": True}):
        out = model.generate(src, 8, vocab_limit=6, **options)
        assert (out < 6).all(), options
        assert (model.generate(src, 8, **options) >= 6).any(), options  # it would without


def test_vocab_limit_is_checked():
    with pytest.raises(ValueError, match="vocab_limit must be a positive integer, got 0"):
        GenerationConfig(vocab_limit=0)


def nan_epsilon(model, module_name):
    model.get_submodule(module_name).eps = float("nan")  # as from a hostile config file
    return model


@pytest.mark.parametrize("options", [{}, {"do_sample": True}, {"use_cache": False}])
def test_nan_logits_are_refused_in_one_line_naming_the_step_gpt(options):
    from glassformer.errors import NonFiniteLogitsError

    model = nan_epsilon(tiny_gpt(), "blocks.1.ln2")
    with pytest.raises(NonFiniteLogitsError, match="decoding step 1: the model's logits are not"):
        model.generate(torch.tensor([[3, 4, 5]]), 5, **options)


def test_logits_that_turn_nan_at_a_later_step_are_refused_naming_that_step():
    model = tiny_gpt()
    calls = []

    def nan_from_the_third(logits, name):
        calls.append(name)
        return torch.full_like(logits, float("nan")) if len(calls) >= 3 else logits

    at_step_3 = pytest.raises(FloatingPointError, match=r"decoding step 3: .* epsilon are likely")
    with model.hooks([("hook_logits", nan_from_the_third)]), at_step_3:
        model.generate(torch.tensor([[3, 4, 5]]), 5)


@pytest.mark.parametrize("options", [{}, {"do_sample": True}, {"beam_size": 3}])
def test_nan_logits_are_refused_in_one_line_naming_the_step_translator(options):
    model = nan_epsilon(tiny_translator(), "decoder.blocks.1.ln2")
    with pytest.raises(
        FloatingPointError, match="decoding step 1: the model's logits are not"
    ) as e:
        model.generate(torch.tensor([[3, 4, 5, 6]]), 5, **options)
    assert "\n" not in str(e.value)


def test_infinite_and_all_masked_logits_are_refused_but_nan_past_the_vocab_limit_is_not():
    from glassformer.errors import NonFiniteLogitsError

    inf = float("inf")
    with pytest.raises(NonFiniteLogitsError, match="not finite"):
        choose_next(torch.tensor([[0.0, inf, 1.0]]))
    with pytest.raises(NonFiniteLogitsError, match="not finite"):
        choose_next(torch.tensor([[-inf, -inf]]), do_sample=True)
    padded_nan = torch.tensor([[0.0, 2.0, 1.0, float("nan")]])
    assert choose_next(padded_nan, vocab_limit=3).tolist() == [1]
