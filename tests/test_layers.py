"""Encoder/decoder layers and stacks against torch.nn's, with copied weights.

This proves the README claim "EncoderLayer, DecoderLayer, Encoder, Decoder equal
nn.TransformerEncoderLayer, nn.TransformerDecoderLayer and their stacks (and a whole
nn.Transformer), both norm orders, ReLU and GELU, train and eval mode, to 1e-5", with the
weights copied either way: ``from_torch_nn`` into ours, ``to_torch_nn`` into nn's.
"""

from pathlib import Path

import pytest
import torch
from torch import nn

from glassformer import Decoder, DecoderLayer, Encoder, EncoderLayer, causal_mask, padding_mask
from glassformer.interop import from_torch_nn, to_torch_nn
from glassformer.modules.block import Block

TOL = dict(atol=1e-5, rtol=1e-5)
D, H, FF = 16, 4, 32
VARIANTS = [(nf, act) for nf in (False, True) for act in ("relu", "gelu")]


def randomise(module, seed=0):
    """nn's layers start with zero biases and unit norms; give every parameter a value."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return module


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 6, D, generator=g)
    memory = torch.randn(3, 5, D, generator=g)
    tgt_ids = torch.tensor([[4] * 6, [4] * 4 + [0] * 2, [4] * 5 + [0]])
    src_ids = torch.tensor([[4] * 5, [4] * 3 + [0] * 2, [4] * 2 + [0] * 3])
    return x, memory, padding_mask(tgt_ids), padding_mask(src_ids)


def nn_kpm(mask):
    """Our (B, 1, 1, T) True = attend → nn's key_padding_mask (B, T) True = ignore."""
    return ~mask[:, 0, 0]


def nn_decode(ref, x, memory, tgt_mask, src_mask):
    """Run nn's decoder (layer or stack) causally, with our (B, 1, 1, T) padding masks."""
    return ref(
        x,
        memory,
        tgt_mask=~causal_mask(6),
        tgt_is_causal=True,
        tgt_key_padding_mask=nn_kpm(tgt_mask),
        memory_key_padding_mask=nn_kpm(src_mask),
    )


def kwargs(norm_first, activation):
    return dict(
        d_model=D, num_heads=H, d_ff=FF, dropout=0.0, activation=activation, norm_first=norm_first
    )


def nn_kwargs(norm_first, activation):
    return dict(
        d_model=D,
        nhead=H,
        dim_feedforward=FF,
        dropout=0.0,
        activation=activation,
        norm_first=norm_first,
        batch_first=True,
    )


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("norm_first, activation", VARIANTS)
def test_encoder_layer_equals_nn(norm_first, activation, train):
    ref = randomise(nn.TransformerEncoderLayer(**nn_kwargs(norm_first, activation)))
    ours = EncoderLayer(**kwargs(norm_first, activation))
    ours.load_state_dict(from_torch_nn(ref.state_dict()))
    ref.train(train), ours.train(train)
    x, _, mask, _ = batch()
    expected = ref(x, src_key_padding_mask=nn_kpm(mask))
    real = mask[:, 0, 0]  # nn's eval fast path leaves padded rows undefined; compare real ones
    out, w, no_cross = ours(x, mask, need_weights=True)  # one output type for both layer kinds
    assert no_cross is None
    torch.testing.assert_close(out[real], expected[real], **TOL)
    fast = ours(x, mask).hidden
    torch.testing.assert_close(fast[real], expected[real], **TOL)
    torch.testing.assert_close(fast, out, **TOL)  # readable == fused, padded rows included
    assert w.shape == (3, H, 6, 6)


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("norm_first, activation", VARIANTS)
def test_decoder_layer_equals_nn(norm_first, activation, train):
    ref = randomise(nn.TransformerDecoderLayer(**nn_kwargs(norm_first, activation)))
    ours = DecoderLayer(**kwargs(norm_first, activation))
    ours.load_state_dict(from_torch_nn(ref.state_dict()))
    ref.train(train), ours.train(train)
    x, memory, tgt_mask, src_mask = batch()
    expected = nn_decode(ref, x, memory, tgt_mask, src_mask)
    out, w_self, w_cross = ours(x, memory, tgt_mask, src_mask, need_weights=True)
    torch.testing.assert_close(out, expected, **TOL)
    torch.testing.assert_close(ours(x, memory, tgt_mask, src_mask).hidden, expected, **TOL)
    assert w_self.shape == (3, H, 6, 6) and w_cross.shape == (3, H, 6, 5)
    # causal: nothing above the diagonal; cross: nothing on padded source keys
    assert (w_self.triu(diagonal=1) == 0).all()
    assert (w_cross[1, :, :, 3:] == 0).all()


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("norm_first, activation", VARIANTS)
def test_encoder_stack_equals_nn(norm_first, activation, train):
    layer = nn.TransformerEncoderLayer(**nn_kwargs(norm_first, activation))
    norm = nn.LayerNorm(D) if norm_first else None
    ref = randomise(nn.TransformerEncoder(layer, 3, norm=norm, enable_nested_tensor=False))
    ours = Encoder(num_layers=3, **kwargs(norm_first, activation))
    ours.load_state_dict(from_torch_nn(ref.state_dict()))
    assert (ours.ln_final is not None) == norm_first
    ref.train(train), ours.train(train)
    x, _, mask, _ = batch()
    real = mask[:, 0, 0]
    expected = ref(x, src_key_padding_mask=nn_kpm(mask))
    out, weights, _ = ours(x, mask, need_weights=True)
    torch.testing.assert_close(out[real], expected[real], **TOL)
    torch.testing.assert_close(ours(x, mask).hidden, out, **TOL)
    assert len(weights) == 3
    # the causal variant is a GPT stack: equal to nn with a causal mask
    causal = Encoder(num_layers=3, causal=True, **kwargs(norm_first, activation))
    causal.load_state_dict(ours.state_dict())
    causal.train(train)
    expected = ref(x, mask=~causal_mask(6), is_causal=True)
    torch.testing.assert_close(causal(x).hidden, expected, **TOL)


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("norm_first, activation", VARIANTS)
def test_decoder_stack_equals_nn(norm_first, activation, train):
    layer = nn.TransformerDecoderLayer(**nn_kwargs(norm_first, activation))
    norm = nn.LayerNorm(D) if norm_first else None
    ref = randomise(nn.TransformerDecoder(layer, 3, norm=norm))
    ours = Decoder(num_layers=3, **kwargs(norm_first, activation))
    ours.load_state_dict(from_torch_nn(ref.state_dict()))
    ref.train(train), ours.train(train)
    x, memory, tgt_mask, src_mask = batch()
    expected = nn_decode(ref, x, memory, tgt_mask, src_mask)
    out, self_w, cross_w = ours(x, memory, tgt_mask, src_mask, need_weights=True)
    torch.testing.assert_close(out, expected, **TOL)
    torch.testing.assert_close(ours(x, memory, tgt_mask, src_mask).hidden, expected, **TOL)
    assert len(self_w) == len(cross_w) == 3


def test_whole_nn_transformer_equals_encoder_plus_decoder():
    ref = randomise(
        nn.Transformer(
            d_model=D,
            nhead=H,
            num_encoder_layers=2,
            num_decoder_layers=2,
            dim_feedforward=FF,
            dropout=0.0,
            batch_first=True,
        )
    )
    sd = ref.state_dict()
    enc = Encoder(num_layers=2, final_norm=True, **kwargs(False, "relu"))
    dec = Decoder(num_layers=2, final_norm=True, **kwargs(False, "relu"))
    enc.load_state_dict(
        from_torch_nn({k[8:]: v for k, v in sd.items() if k.startswith("encoder.")})
    )
    dec.load_state_dict(
        from_torch_nn({k[8:]: v for k, v in sd.items() if k.startswith("decoder.")})
    )
    x, memory_in, tgt_mask, src_mask = batch()
    expected = ref(
        memory_in,
        x,
        tgt_mask=~causal_mask(6),
        tgt_is_causal=True,
        src_key_padding_mask=nn_kpm(src_mask),
        tgt_key_padding_mask=nn_kpm(tgt_mask),
        memory_key_padding_mask=nn_kpm(src_mask),
    )
    memory = enc(memory_in, src_mask).hidden
    torch.testing.assert_close(dec(x, memory, tgt_mask, src_mask).hidden, expected, **TOL)


def nn_twin(ours, norm_first):
    """The torch.nn module of the same kind and size as ``ours``, with its weights loaded
    through ``to_torch_nn`` (strictly: every key must land), in eval mode."""
    nn_kw = nn_kwargs(norm_first, "gelu")
    final_norm = nn.LayerNorm(D) if norm_first else None  # ours has one under pre-norm
    twins = {
        EncoderLayer: lambda: nn.TransformerEncoderLayer(**nn_kw),
        DecoderLayer: lambda: nn.TransformerDecoderLayer(**nn_kw),
        Encoder: lambda: nn.TransformerEncoder(
            nn.TransformerEncoderLayer(**nn_kw), 2, norm=final_norm, enable_nested_tensor=False
        ),
        Decoder: lambda: nn.TransformerDecoder(
            nn.TransformerDecoderLayer(**nn_kw), 2, norm=final_norm
        ),
    }
    ref = twins[type(ours)]()
    ref.load_state_dict(to_torch_nn(ours.state_dict()))
    return ref.eval()


@pytest.mark.parametrize("stack", [False, True])
@pytest.mark.parametrize("norm_first", [False, True])
def test_to_torch_nn_makes_nn_encoders_compute_ours(norm_first, stack):
    """Our randomised EncoderLayer / Encoder, converted by to_torch_nn and loaded into nn's,
    give nn the same outputs (1e-5, eval, padding mask): a swapped norm1/norm2, q/k/v or
    linear1/linear2 would not. Converting back gives our exact state dict."""
    layer_kw = kwargs(norm_first, "gelu")
    ours = randomise(Encoder(num_layers=2, **layer_kw) if stack else EncoderLayer(**layer_kw))
    ours.eval()
    ref = nn_twin(ours, norm_first)
    x, _, mask, _ = batch()
    real = mask[:, 0, 0]  # nn's eval fast path leaves padded rows undefined; compare real ones
    expected = ref(x, src_key_padding_mask=nn_kpm(mask))
    torch.testing.assert_close(ours(x, mask).hidden[real], expected[real], **TOL)
    torch.testing.assert_close(from_torch_nn(ref.state_dict()), ours.state_dict(), atol=0, rtol=0)


@pytest.mark.parametrize("stack", [False, True])
@pytest.mark.parametrize("norm_first", [False, True])
def test_to_torch_nn_makes_nn_decoders_compute_ours(norm_first, stack):
    """As for encoders, for DecoderLayer / Decoder (causal, target and memory padding);
    three LayerNorms here, so any two swapped would show."""
    layer_kw = kwargs(norm_first, "gelu")
    ours = randomise(Decoder(num_layers=2, **layer_kw) if stack else DecoderLayer(**layer_kw))
    ours.eval()
    ref = nn_twin(ours, norm_first)
    x, memory, tgt_mask, src_mask = batch()
    expected = nn_decode(ref, x, memory, tgt_mask, src_mask)
    torch.testing.assert_close(ours(x, memory, tgt_mask, src_mask).hidden, expected, **TOL)
    torch.testing.assert_close(from_torch_nn(ref.state_dict()), ours.state_dict(), atol=0, rtol=0)


def test_attention_dropout_matches_nn_in_eval_and_drops_weights_in_training():
    ref = randomise(nn.TransformerEncoderLayer(**{**nn_kwargs(False, "relu"), "dropout": 0.3}))
    ours = EncoderLayer(**{**kwargs(False, "relu"), "dropout": 0.3, "attention_dropout": 0.3})
    ours.load_state_dict(from_torch_nn(ref.state_dict()))
    assert ours.attn.dropout == 0.3
    ref.eval(), ours.eval()
    x, _, mask, _ = batch()
    real = mask[:, 0, 0]
    expected = ref(x, src_key_padding_mask=nn_kpm(mask))
    torch.testing.assert_close(ours(x, mask).hidden[real], expected[real], **TOL)
    ours.train()
    torch.manual_seed(0)
    w = ours(x, mask, need_weights=True).self_attn_weights
    assert 0.2 < (w[0] == 0).float().mean() < 0.4  # batch 0 has no padding: zeros are dropout
    assert EncoderLayer(d_model=D, num_heads=H, d_ff=FF).attn.dropout == 0.0  # the paper's


def test_dropout_is_active_in_training_and_off_in_eval():
    layer = EncoderLayer(d_model=D, num_heads=H, d_ff=FF, dropout=0.5)
    x = torch.randn(2, 6, D)
    layer.train()
    assert not torch.allclose(layer(x).hidden, layer(x).hidden)
    layer.eval()
    torch.testing.assert_close(layer(x).hidden, layer(x).hidden, atol=0, rtol=0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(d_model=10, num_heads=3, d_ff=8), "d_model=10 is not divisible by num_heads=3"),
        (dict(d_model=8, num_heads=2, d_ff=8, dropout=-0.1), "-0.1"),
        (dict(d_model=8, num_heads=2, d_ff=8, activation="swish"), "'swish'"),
        (dict(d_model=8, num_heads=2, d_ff=0), "d_ff must be a positive integer, got 0"),
    ],
)
def test_bad_layer_arguments(kwargs, message):
    for cls in (EncoderLayer, DecoderLayer):
        with pytest.raises(ValueError, match=message):
            cls(**kwargs)
    with pytest.raises(ValueError, match="num_layers must be a positive integer, got 0"):
        Encoder(num_layers=0, d_model=8, num_heads=2, d_ff=8)


def _old_modules():
    small = dict(d_model=16, num_heads=2, d_ff=32, dropout=0.0)
    return {
        "enc_layer": EncoderLayer(**small),
        "dec_layer": DecoderLayer(**small),
        "enc": Encoder(num_layers=2, norm_first=True, **small),
        "dec": Decoder(num_layers=2, norm_first=True, **small),
    }


# The outputs were recorded on an Intel Xeon; another CPU's kernels (AVX2 forced on it)
# moved them by at most 4.8e-7 there, while old names mapped to the wrong modules (the decoder's
# self_attn read as its cross_attn) move them by O(1).
OUTPUT_ATOL = 1e-5


def test_state_dicts_under_the_old_part_names_load_and_compute_what_they_did():
    """Layers and stacks saved at 7a7e08c (self_attn, feed_forward, norm1..3, layers.N, norm)
    load strictly into today's blocks and give the outputs that code gave (bit for bit on the
    CPU they were recorded on; within ``OUTPUT_ATOL`` on any)."""
    from safetensors.torch import load_file

    saved = load_file(Path(__file__).parent / "data/runs_7a7e08c/layers.safetensors")
    x, memory = saved["input/x"], saved["input/memory"]
    for name, module in _old_modules().items():
        state = {k.split("/", 1)[1]: v for k, v in saved.items() if k.startswith(f"{name}/")}
        assert any("self_attn." in k for k in state)  # the old names, really
        module.load_state_dict(state)  # strict: nothing missing, nothing left over
        out = module.eval()(x, memory)[0] if name.startswith("dec") else module.eval()(x)[0]
        torch.testing.assert_close(out, saved[f"output/{name}"], rtol=0, atol=OUTPUT_ATOL)


def test_the_old_part_names_still_read_the_parts():
    m = _old_modules()
    enc, dec = m["enc_layer"], m["dec_layer"]
    assert (enc.self_attn, enc.feed_forward, enc.norm1, enc.norm2) == (
        enc.attn,
        enc.mlp,
        enc.ln1,
        enc.ln2,
    )
    assert (dec.norm1, dec.norm2, dec.norm3) == (dec.ln1, dec.ln_cross, dec.ln2)
    assert m["enc"].layers is m["enc"].blocks and m["enc"].norm is m["enc"].ln_final


def test_a_block_reads_its_inputs_as_one_bundle_or_as_keywords():
    """``BlockInputs`` (what the models hand every block) and the same fields as keywords
    give the same block output; both at once is one error."""
    from glassformer.modules import BlockInputs

    torch.manual_seed(0)
    layer = DecoderLayer(d_model=16, num_heads=4, d_ff=32, dropout=0.0).eval()
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    keys = padding_mask(torch.tensor([[1, 2, 3, 0, 0], [1, 2, 3, 4, 5]]))
    bundle = BlockInputs(mask=keys, memory=memory, need_weights=True)
    one = layer(x, inputs=bundle)
    other = Block.forward(layer, x, keys, memory=memory, need_weights=True)
    torch.testing.assert_close(one.hidden, other.hidden, rtol=0, atol=0)
    assert one.cross_attn_weights.shape == (2, 4, 5, 7)
    with pytest.raises(ValueError, match="inputs= or their fields as keywords, not both"):
        layer(x, inputs=bundle, memory=memory)


def test_every_model_runs_its_blocks_as_one_stack_after_its_embeddings():
    """A ``Backbone`` is a ``Stack``: the same blocks and final norm, run by ``Stack.run`` on
    the embedded ids, give the model's hidden states, and its module tree (and state dict)
    lists the embeddings before the blocks, in the order they run."""
    from glassformer import GPT, GPTConfig
    from glassformer.modules import Stack
    from glassformer.modules.block import BlockInputs

    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("llama-tiny", vocab_size=50, dropout=0.0)).eval()
    assert isinstance(model, Stack)
    ids = torch.randint(0, 50, (2, 7))
    positions = torch.arange(7)
    with torch.no_grad():
        hidden = model.run_stack(model.embed_tokens(ids), positions=positions).hidden
        angles = model.rotary.cos_sin(positions, torch.float32)
        alone = Stack(list(model.blocks), model.ln_final)
        inputs = BlockInputs(positions=positions, angles=angles)
        expected = alone.run(model.embed_tokens(ids), inputs).hidden
    assert torch.equal(hidden, expected)
    children = [name for name, _ in model.named_children()]
    assert children.index("embed") < children.index("blocks") < children.index("ln_final")
    assert next(iter(model.state_dict())) == "embed.weight"
