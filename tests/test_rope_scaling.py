"""modules.rope_scaling: each rotary scaling rule gives transformers' frequencies, and a
scaled ``RotaryEmbedding`` turns positions by transformers' cosines and sines."""

from __future__ import annotations

import pytest
import torch

from glassformer.modules.rope_scaling import RopeScaling, frequencies
from glassformer.modules.rotary import RotaryEmbedding

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

HEAD_DIM = 64  # 32 pairs: enough for llama3's band and yarn's ramp to fall inside
MAX_LEN = 256  # max_position_embeddings
LONGROPE = {
    "short_factor": [1.0 + 0.05 * i for i in range(HEAD_DIM // 2)],
    "long_factor": [1.0 + 0.4 * i for i in range(HEAD_DIM // 2)],
}
# name → (transformers' rope_parameters, the same rule as glassformer's RopeScaling)
CASES = {
    "linear": ({"rope_type": "linear", "factor": 4.0}, RopeScaling("linear", 4.0)),
    "dynamic": (
        {"rope_type": "dynamic", "factor": 2.0},
        RopeScaling("dynamic", 2.0, max_len=MAX_LEN),
    ),
    "llama3": (
        {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        RopeScaling("llama3", 32.0, original_max_len=64),
    ),  # fmt: skip
    "yarn": (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        RopeScaling("yarn", 4.0, original_max_len=64),
    ),
    "yarn-mscale-untruncated": (
        {
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 32,
            "mscale": 0.707,
            "mscale_all_dim": 1.0,
            "beta_fast": 16.0,
            "beta_slow": 2.0,
            "truncate": False,
        },
        RopeScaling(
            "yarn",
            8.0,
            original_max_len=32,
            mscale=0.707,
            mscale_all_dim=1.0,
            beta_fast=16.0,
            beta_slow=2.0,
            truncate=False,
        ),
    ),  # fmt: skip
    "longrope": (
        {"rope_type": "longrope", "original_max_position_embeddings": 64, **LONGROPE},
        RopeScaling("longrope", original_max_len=64, max_len=MAX_LEN, **LONGROPE),
    ),
}
THETA = {"llama3": 500000.0}


def _hf_config(name: str):
    params, _ = CASES[name]
    theta = THETA.get(name.split("-")[0], 10000.0)
    return transformers.LlamaConfig(
        hidden_size=HEAD_DIM * 4,
        num_attention_heads=4,
        max_position_embeddings=MAX_LEN,
        rope_parameters={**params, "rope_theta": theta},
    )


@pytest.mark.parametrize("length", [None, 40, 65, 300, 1000])
@pytest.mark.parametrize("name", sorted(CASES))
def test_each_rule_gives_transformers_frequencies(name, length):
    """θ_i and the factor on cos and sin, for the context trained on and for lengths read
    below, just past and far past it (dynamic and longrope change with the length)."""
    config = _hf_config(name)
    rule = CASES[name][0]["rope_type"]
    expected, expected_factor = ROPE_INIT_FUNCTIONS[rule](config, None, seq_len=length)
    theta = config.rope_parameters["rope_theta"]
    got, factor = frequencies(
        CASES[name][1], theta, HEAD_DIM, None if length is None else torch.tensor(length)
    )
    torch.testing.assert_close(got, expected.float(), rtol=2e-6, atol=0)
    assert factor == pytest.approx(expected_factor, rel=1e-12)
    plain = 1.0 / theta ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM)
    unscaled = rule == "dynamic" and (length or 0) <= MAX_LEN  # dynamic: plain up to it
    assert torch.allclose(got, plain) == unscaled


@pytest.mark.parametrize("T", [10, 100, 300])
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_scaled_rotary_turns_positions_as_transformers_does(name, T):
    """``RotaryEmbedding(scaling=...)``'s cosines and sines, the attention factor included,
    equal transformers' ``LlamaRotaryEmbedding`` at T positions (a fresh one each time:
    transformers' dynamic rule remembers the longest length seen)."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = _hf_config(name)
    theirs = LlamaRotaryEmbedding(config)
    positions = torch.arange(T)[None]
    cos, sin = theirs(torch.zeros(1, T, HEAD_DIM), positions)
    ours = RotaryEmbedding(HEAD_DIM, config.rope_parameters["rope_theta"], CASES[name][1])
    angles = ours.cos_sin(positions, torch.float32)
    torch.testing.assert_close(angles.cos[:, 0], cos, rtol=0, atol=2e-5)
    torch.testing.assert_close(angles.sin[:, 0], sin, rtol=0, atol=2e-5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(rope_type="su", factor=2.0), "rope_type must be one of"),
        (dict(rope_type="linear"), "linear scaling needs a factor > 0, got None"),
        (dict(rope_type="linear", factor=float("nan")), "needs a factor > 0, got nan"),
        (dict(rope_type="llama3", factor=8.0), "needs original_max_len"),
        (dict(rope_type="llama3", factor=8.0, original_max_len=64, low_freq_factor=4.0),
         "0 < low_freq_factor < high_freq_factor"),
        (dict(rope_type="dynamic", factor=2.0), "dynamic scaling needs max_len"),
        (dict(rope_type="longrope", original_max_len=64), "short_factor and long_factor"),
        (dict(rope_type="factors"), "factors scaling needs its factors"),
    ],
)  # fmt: skip
def test_a_rule_missing_a_number_or_of_no_known_kind_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RopeScaling(**kwargs)


def test_longrope_factors_must_cover_the_rotated_pairs():
    scaling = RopeScaling("longrope", original_max_len=64, short_factor=(1.0,), long_factor=(2.0,))
    with pytest.raises(
        ValueError, match="short_factor has 1 factors; the rotated width 64 needs 32"
    ):
        RotaryEmbedding(HEAD_DIM, 10000.0, scaling)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(rope_type="yarn", factor=4.0, original_max_len=64, mscale="big"),
         "mscale must be a number > 0, got 'big'"),
        (dict(rope_type="yarn", factor=4.0, original_max_len=64, truncate="yes"),
         "truncate must be true or false"),
        (dict(rope_type="longrope", original_max_len=64, short_factor=[1.0, "x"],
              long_factor=[1.0, 2.0]), "short_factor must be a list of numbers > 0"),
        (dict(rope_type="llama3", factor=8.0, original_max_len=64, high_freq_factor=float("inf")),
         "high_freq_factor must be a number > 0, got inf"),
    ],
)  # fmt: skip
def test_a_hostile_number_in_a_rule_is_refused_when_made_not_when_used(kwargs, message):
    """A config's scaling numbers are checked as the rule is made (one error naming the
    field), not left for ``math.log`` to meet as the model is built."""
    with pytest.raises(ValueError, match=message):
        RopeScaling(**kwargs)


@pytest.mark.parametrize(
    "scaling, base, dim, message",
    [
        (RopeScaling("yarn", 4.0, original_max_len=64), 1.0, 64, "yarn scaling with base 1.0"),
        (RopeScaling("dynamic", 2.0, max_len=64), 10000.0, 2, "dynamic scaling with base"),
    ],
)
def test_a_rule_that_cannot_turn_these_features_is_refused_when_checked(
    scaling, base, dim, message
):
    """A base of 1 (yarn divides by its log) or a 2-feature head (dynamic's d/(d−2)) is a
    ValueError naming the rule, which the family configs raise as they are made."""
    with pytest.raises(ValueError, match=message):
        scaling.check(base, dim)
