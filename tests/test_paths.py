"""Path patching (glassformer.inspect.paths) on a model built so the answer is known: a
planted two-head circuit, head (0, 0) → head (1, 1)'s values, beside heads that carry the
same change by other routes."""

from __future__ import annotations

import pytest
import torch

from glassformer import GPT, GPTConfig
from glassformer.inspect import activation_patching, logit_difference, path_patching

TOKENS, SUB = slice(0, 8), {"A": slice(8, 16), "others": slice(16, 24)}


def planted() -> GPT:
    """Two layers of three heads (8 wide), d_model 24 in three subspaces: the tokens (0–7,
    which the head reads), what head (0, 0) writes (8–15), what heads (0, 1) and (0, 2) write
    (16–23). Layer 1: head 1 takes its values from head (0, 0)'s subspace only; heads 0 and 2
    from the other heads'; every layer-1 head's queries and keys read the tokens. The MLPs
    write nothing; RMSNorm (no centring), so subspaces stay apart but for each position's
    scale."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=8, max_len=8, d_model=24, num_heads=3, num_layers=2, d_ff=32,
                       dropout=0.0, norm_first=True, norm="rms", positional="learned")  # fmt: skip
    model = GPT(config).eval()
    with torch.no_grad():
        model.embed.weight.zero_()
        model.embed.weight[:, TOKENS] = torch.randn(8, 8) * 2
        model.pos_embed.weight.zero_()
        model.pos_embed.weight[:, TOKENS] = torch.randn(8, 8) * 0.3
        for layer, block in enumerate(model.blocks):
            block.mlp.linear2.weight.zero_()
            block.mlp.linear2.bias.zero_()
            qkv, out = block.attn.qkv_proj.weight, block.attn.out_proj.weight  # (72, 24), (24, 24)
            qkv[:48, 8:] = 0  # queries and keys read the tokens only
            for head in range(3):
                v = qkv[48 + 8 * head : 56 + 8 * head]  # head's value rows
                cols = slice(8 * head, 8 * head + 8)
                out[:, cols] = 0
                if layer == 0:
                    v[:, 8:] = 0  # values of the tokens
                    rows = SUB["A"] if head == 0 else SUB["others"]
                    out[rows, cols] = torch.randn(8, 8)
                else:
                    reads = SUB["A"] if head == 1 else SUB["others"]
                    keep = v[:, reads].clone()
                    v.zero_()
                    v[:, reads] = keep * 2
                    out[TOKENS, cols] = torch.randn(8, 8)  # towards the logits
            block.attn.out_proj.bias.zero_()
    return model


def value(model, ids, metric) -> float:
    with torch.no_grad():
        return float(metric(model(ids).logits))


def inputs():
    clean = torch.tensor([[1, 2, 3, 4, 5, 6]])
    corrupt = clean.clone()
    corrupt[0, 0] = 7  # every head attends to the first position with some weight
    return clean, corrupt


def test_the_planted_circuit_is_found_by_sweeping_the_senders():
    """To head (1, 1)'s values, only head (0, 0) sends: its effect is many times any other
    head's (they reach head (1, 1) only through the norm's scale). To head (1, 0)'s values,
    the other two heads send, and (0, 0) does not. Activation patching, by contrast, sees all
    three layer-0 heads matter to the answer."""
    model = planted()
    clean, corrupt = inputs()
    metric = logit_difference(answer_id=2, wrong_id=5)
    clean_value = value(model, clean, metric)
    to_b = path_patching(model, clean, corrupt, metric, receivers=[(1, 1)], receiver_input="v")
    assert to_b.shape == (2, 3) and torch.isnan(to_b[1]).all()  # layer 1 cannot send to itself
    moved = (to_b[0] - clean_value).abs()
    assert moved.argmax() == 0 and moved[0] > 20 * moved[1:].max() and moved[0] > 0.05
    to_other = path_patching(model, clean, corrupt, metric, receivers=[(1, 0)], receiver_input="v")
    moved = (to_other[0] - clean_value).abs()
    assert moved[0] < 0.05 * moved[1:].max()
    everywhere = activation_patching(model, corrupt, clean, metric, what="z")[0] - clean_value
    assert (everywhere.abs() > 0.02).all()  # every layer-0 head matters by some route


def test_a_path_straight_to_the_logits_and_the_whole_route_agree_with_patching():
    """Senders (0, 0) with no receivers: head (0, 0) writes nothing the logits read directly
    (only the final norm's scale sees it), so its direct path moves the answer by a small
    part of what its path through head (1, 1) does. Every head as a sender is the clean run
    with every head's output taken from the corrupted run."""
    model = planted()
    clean, corrupt = inputs()
    metric = logit_difference(answer_id=2, wrong_id=5)
    clean_value = value(model, clean, metric)
    direct = path_patching(model, clean, corrupt, metric, senders=[(0, 0)])
    through_b = path_patching(
        model, clean, corrupt, metric, senders=[(0, 0)], receivers=[(1, 1)], receiver_input="v"
    )
    assert abs(float(direct) - clean_value) < 0.05 * abs(float(through_b) - clean_value)
    heads = [(layer, h) for layer in range(2) for h in range(3)]
    every = path_patching(model, clean, corrupt, metric, senders=heads)
    # the corrupted run differs from the clean one only through the heads and the
    # token's own direct path; holding the heads at corrupted values leaves the latter clean
    with torch.no_grad():
        _, corrupt_cache = model.run_with_cache(corrupt, names="*hook_z")
    put = lambda value, name: corrupt_cache[name]  # noqa: E731
    with torch.no_grad():
        expected = float(metric(model.run_with_hooks(clean, hooks=[("*hook_z", put)]).logits))
    assert float(every) == pytest.approx(expected, abs=1e-5)


def test_bad_requests_are_one_line():
    model = planted()
    clean, corrupt = inputs()
    metric = logit_difference(1, 2)
    with pytest.raises(ValueError, match=r"head \(2, 0\) does not exist"):
        path_patching(model, clean, corrupt, metric, senders=[(2, 0)])
    with pytest.raises(ValueError, match="letters of 'qkv'"):
        path_patching(model, clean, corrupt, metric, receivers=[(1, 1)], receiver_input="x")
    with pytest.raises(ValueError, match="same shapes"):
        path_patching(model, clean, corrupt[:, :3], metric)
