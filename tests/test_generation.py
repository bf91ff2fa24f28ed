"""Generation: greedy equals a hand-written loop, sampling is reproducible and stays
inside top-k / top-p, stop tokens, and the translator's greedy decoding."""

import pytest
import torch

from glassformer import GPT, GPTConfig, Seq2SeqConfig, Seq2SeqTransformer
from glassformer.generation import choose_next


def tiny_gpt(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig.preset("tiny", vocab_size=30, max_len=16, num_layers=2)).eval()


def test_greedy_equals_a_hand_written_argmax_loop():
    model = tiny_gpt()
    prompt = torch.tensor([[3, 4, 5], [6, 7, 8]])
    ids = prompt
    with torch.no_grad():
        for _ in range(20):  # runs past max_len: the context is cropped to the last 16
            next_id = model(ids[:, -16:]).logits[:, -1].argmax(-1)
            ids = torch.cat([ids, next_id[:, None]], dim=1)
    out = model.generate(prompt, 20)
    assert out.shape == (2, 23)
    assert torch.equal(out, ids)


def test_sampling_is_reproducible_with_a_seed():
    model = tiny_gpt()
    prompt = torch.tensor([[3, 4, 5]])

    def sample(seed):
        g = torch.Generator().manual_seed(seed)
        return model.generate(prompt, 15, do_sample=True, generator=g)

    assert torch.equal(sample(1), sample(1))
    assert not torch.equal(sample(1), sample(2))


def test_top_k_1_is_greedy():
    model = tiny_gpt()
    prompt = torch.tensor([[3, 4, 5]])
    g = torch.Generator().manual_seed(0)
    sampled = model.generate(prompt, 10, do_sample=True, top_k=1, temperature=2.0, generator=g)
    assert torch.equal(sampled, model.generate(prompt, 10))


def test_eos_stops_generation_and_pads_finished_rows():
    model = tiny_gpt()
    with torch.no_grad():
        model.lm_head.weight.zero_()  # all logits equal except by the bias below...
        model.lm_head.bias = torch.nn.Parameter(torch.zeros(30))
        model.lm_head.bias[7] = 5.0  # ...so token 7 always wins
    out = model.generate(torch.tensor([[3, 4], [5, 6]]), 10, eos_id=7)
    assert out.tolist() == [[3, 4, 7], [5, 6, 7]]


def test_choose_next_never_leaves_the_top_k_or_the_nucleus():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=g)
    allowed_k = logits.topk(5, dim=-1).indices
    probs = logits.softmax(-1)
    for _ in range(20):
        picked = choose_next(logits, do_sample=True, top_k=5, generator=g)
        assert (allowed_k == picked[:, None]).any(-1).all()
        picked = choose_next(logits, do_sample=True, top_p=0.5, generator=g)
        # the nucleus: tokens whose more-likely predecessors sum to less than 0.5
        p_picked = probs.gather(1, picked[:, None])
        mass_above = (probs * (probs > p_picked)).sum(-1)
        assert (mass_above < 0.5).all()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=0.0), "temperature must be > 0 when sampling, got 0.0"),
        (dict(top_k=0), "top_k must be a positive integer, got 0"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\], got 1.5"),
    ],
)
def test_bad_sampling_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        choose_next(torch.randn(2, 10), do_sample=True, **kwargs)


def test_translator_learns_to_copy_and_decodes_greedily():
    torch.manual_seed(0)
    cfg = Seq2SeqConfig.preset(
        "tiny", src_vocab_size=12, tgt_vocab_size=12, dropout=0.0, max_len=12
    )
    model = Seq2SeqTransformer(cfg)
    src = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 0], [10, 11, 3, 4], [5, 5, 0, 0]])
    labels = torch.cat([src, torch.zeros(4, 1, dtype=torch.long)], 1)
    for i, n in enumerate((4, 3, 4, 2)):
        labels[i, n] = 2
    tgt_in = torch.cat([torch.ones(4, 1, dtype=torch.long), labels[:, :-1]], 1)
    tgt_in[tgt_in == 2] = 0
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(300):
        loss = model(src, tgt_in, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    out = model.generate(src, 8)
    assert (out[:, 0] == 1).all()
    for i, n in enumerate((4, 3, 4, 2)):
        assert out[i, 1 : n + 2].tolist() == src[i, :n].tolist() + [2]  # the copy, then EOS
        assert (out[i, n + 2 :] == 0).all()  # finished rows are padded
