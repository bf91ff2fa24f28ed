"""The gated feed-forward (SwiGLU) against Hugging Face's LlamaMLP with the same weights."""

import pytest
import torch

from glassformer import EncoderLayer
from glassformer.modules.feedforward import FeedForward, GatedFeedForward, feed_forward


def test_swiglu_equals_llama_mlp():
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    from transformers import LlamaConfig

    torch.manual_seed(0)
    ours = GatedFeedForward(d_model=16, d_ff=40)
    for p in ours.parameters():
        torch.nn.init.normal_(p, std=0.2)
    ref = llama.LlamaMLP(LlamaConfig(hidden_size=16, intermediate_size=40, num_attention_heads=4))
    ref.load_state_dict(ours.state_dict())  # the same names: gate_proj, up_proj, down_proj
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-6)


def test_swiglu_by_hand():
    torch.manual_seed(1)
    ff = GatedFeedForward(d_model=8, d_ff=12, bias=True)
    x = torch.randn(3, 8)
    gate = x @ ff.gate_proj.weight.T + ff.gate_proj.bias
    up = x @ ff.up_proj.weight.T + ff.up_proj.bias
    expected = (gate * torch.sigmoid(gate) * up) @ ff.down_proj.weight.T + ff.down_proj.bias
    torch.testing.assert_close(ff(x), expected)


def test_the_activation_name_picks_the_block():
    assert isinstance(feed_forward(d_model=8, d_ff=16, activation="swiglu"), GatedFeedForward)
    assert isinstance(feed_forward(d_model=8, d_ff=16, activation="gelu"), FeedForward)
    layer = EncoderLayer(d_model=8, num_heads=2, d_ff=16, activation="swiglu")
    assert {"gate_proj", "up_proj", "down_proj"} <= {
        n.split(".")[1] for n in layer.state_dict() if n.startswith("mlp.")
    }


def test_bad_activation_names_the_choices():
    with pytest.raises(ValueError, match="swiglu"):
        feed_forward(d_model=8, d_ff=16, activation="geglu")
    with pytest.raises(ValueError, match="got 'swiglu'"):
        FeedForward(d_model=8, d_ff=16, activation="swiglu")
