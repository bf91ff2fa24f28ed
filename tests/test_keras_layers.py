"""The Keras twin's layers give the PyTorch modules' numbers with copied weights (fp32, 1e-5),
on padded batches, both norm orders, every activation, wide heads; their configs round-trip."""

import keras
import numpy as np
import pytest
import torch

import glassformer.keras as gk
from glassformer import modules
from glassformer.keras.convert import copy_from_torch, copy_to_torch

ops = keras.ops
# Keras's torch backend calls np.array(tensor, copy=False), which torch's __array__ predates
# (and one torch thread: on a busy 2-core machine two make these small steps many times slower)
pytestmark = [
    pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning"),
    pytest.mark.usefixtures("one_thread"),
]


D = 16
IDS = torch.tensor([[3, 4, 5, 6, 7, 8], [3, 4, 5, 0, 0, 0], [9, 0, 0, 0, 0, 0]])
MASK = modules.padding_mask(IDS)  # (3, 1, 1, 6), rows with 6, 3 and 1 real tokens
ATOL = 1e-5


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def numpy(x):
    return np.asarray(ops.convert_to_numpy(x))


def twin(torch_module, keras_layer, input_shape=(None, None, D)):
    """Build the Keras layer and copy the (randomised) PyTorch module's weights into it."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in torch_module.parameters():  # LayerNorm starts at 1/0: move it off
            p.add_(0.1 * torch.randn_like(p))
    keras_layer.build(input_shape)
    copy_from_torch(keras_layer, torch_module.eval())
    return keras_layer


def close(keras_out, torch_out):
    np.testing.assert_allclose(numpy(keras_out), torch_out.detach().numpy(), rtol=0, atol=ATOL)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_heads=4),
        dict(num_heads=2, head_dim=D, qkv_bias=False),  # Bloem's wide heads
        dict(num_heads=4, causal=True),
    ],
    ids=["narrow", "wide-no-bias", "causal"],
)
def test_self_attention_equals_pytorch(kwargs):
    ref = modules.MultiHeadAttention(d_model=D, **kwargs)
    layer = twin(ref, gk.MultiHeadAttention(d_model=D, **kwargs))
    x = randn(3, 6, D)
    want = ref(x, mask=MASK, need_weights=True)
    got = layer(x.numpy(), attention_mask=MASK.numpy(), need_weights=True)
    close(got.output, want.output)
    close(got.weights, want.weights)


def test_cross_attention_equals_pytorch():
    ref = modules.MultiHeadAttention(d_model=D, num_heads=4)
    layer = twin(ref, gk.MultiHeadAttention(d_model=D, num_heads=4))
    x, memory = randn(3, 4, D), randn(3, 6, D, seed=1)
    want = ref(x, memory, mask=MASK, need_weights=True)
    got = layer(x.numpy(), memory.numpy(), attention_mask=MASK.numpy(), need_weights=True)
    close(got.output, want.output)
    close(got.weights, want.weights)


@pytest.mark.parametrize("need_weights", [True, False], ids=["readable", "fused"])
def test_fully_masked_row_gives_zeros_not_nan(need_weights):
    q = k = v = randn(1, 2, 3, 4).numpy()
    mask = np.array([[True, True, False], [False, False, False], [True, False, False]])
    out, weights = gk.scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights)
    assert np.isfinite(numpy(out)).all()
    np.testing.assert_array_equal(numpy(out)[:, :, 1], 0.0)
    readable = gk.scaled_dot_product_attention(q, k, v, mask).output
    np.testing.assert_allclose(numpy(out), numpy(readable), rtol=0, atol=1e-6)
    assert (weights is None) != need_weights


def test_fused_path_equals_the_readable_path_in_the_layer():
    layer = gk.MultiHeadAttention(d_model=D, num_heads=4)
    x = randn(3, 6, D).numpy()
    fused = layer(x, attention_mask=MASK.numpy())
    readable = layer(x, attention_mask=MASK.numpy(), need_weights=True)
    assert fused.weights is None and readable.weights is not None
    np.testing.assert_allclose(numpy(fused.output), numpy(readable.output), rtol=0, atol=1e-6)


def test_attention_dropout_acts_on_the_weights_only_in_training():
    layer = gk.MultiHeadAttention(d_model=D, num_heads=4, dropout=0.5)
    x = randn(3, 6, D).numpy()
    evaluated = numpy(layer(x, need_weights=True).weights)
    np.testing.assert_allclose(evaluated.sum(-1), 1.0, atol=1e-6)
    trained = numpy(layer(x, need_weights=True, training=True).weights)
    assert (trained == 0).any() and trained.max() > evaluated.max()


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
def test_feed_forward_equals_pytorch(activation):
    ref = modules.FeedForward(d_model=D, d_ff=32, activation=activation)
    layer = twin(ref, gk.FeedForward(d_model=D, d_ff=32, activation=activation))
    x = randn(3, 6, D)
    close(layer(x.numpy()), ref(x))


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_equals_pytorch(norm_first, activation):
    kwargs = dict(d_model=D, num_heads=4, d_ff=32, norm_first=norm_first, activation=activation)
    ref = modules.EncoderLayer(**kwargs)
    layer = twin(ref, gk.EncoderLayer(**kwargs))
    x = randn(3, 6, D)
    want = ref(x, MASK, need_weights=True)
    got = layer(x.numpy(), attention_mask=MASK.numpy(), need_weights=True)
    close(got.hidden, want.hidden)
    close(got.self_attn_weights, want.self_attn_weights)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_encoder_stack_equals_pytorch_and_copies_back(norm_first):
    kwargs = dict(d_model=D, num_heads=2, head_dim=D, d_ff=32, norm_first=norm_first)
    ref = modules.Encoder(num_layers=3, **kwargs)
    layer = twin(ref, gk.Encoder(num_layers=3, **kwargs))
    assert (layer.ln_final is None) == (ref.ln_final is None)
    x = randn(3, 6, D)
    close(layer(x.numpy(), attention_mask=MASK.numpy()).hidden, ref(x, MASK).hidden)
    back = modules.Encoder(num_layers=3, **kwargs)
    copy_to_torch(layer, back)
    for name, value in ref.state_dict().items():
        assert torch.equal(back.state_dict()[name], value), name


@pytest.mark.parametrize("kind", ["sinusoidal", "learned"])
def test_positions_equal_pytorch(kind):
    ref = modules.positional_encoding(kind, d_model=D, max_len=10)
    layer = twin(ref, gk.position.positional_encoding(kind, d_model=D, max_len=10))
    x = randn(3, 6, D)
    close(layer(x.numpy()), ref(x))
    close(layer(x.numpy(), start=4), ref(x, start=4))
    with pytest.raises(ValueError, match="longer than the model's max_len=10"):
        layer(randn(1, 11, D).numpy())


def test_token_embedding_equals_pytorch():
    ref = modules.TokenEmbedding(vocab_size=12, d_model=D, scale=True)
    layer = twin(ref, gk.TokenEmbedding(vocab_size=12, d_model=D, scale=True), (None, None))
    close(layer(IDS.numpy()), ref(IDS))


LAYERS = {
    "attention": lambda: gk.MultiHeadAttention(d_model=D, num_heads=2, head_dim=D, causal=True),
    "feed-forward": lambda: gk.FeedForward(d_model=D, d_ff=32, activation="gelu", dropout=0.2),
    "encoder layer": lambda: gk.EncoderLayer(d_model=D, num_heads=4, d_ff=32, norm_first=True),
    "encoder": lambda: gk.Encoder(num_layers=2, d_model=D, num_heads=4, d_ff=32, norm_first=True),
    "sinusoidal": lambda: gk.SinusoidalPositionalEncoding(d_model=D, max_len=7),
    "learned": lambda: gk.LearnedPositionalEmbedding(max_len=7, d_model=D),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_config_round_trip_gives_the_same_layer(name):
    layer = LAYERS[name]()
    x = randn(3, 6, D).numpy()
    layer.build(x.shape)
    again = type(layer).from_config(layer.get_config())
    assert again.get_config() == layer.get_config()
    again.build(x.shape)
    again.set_weights(layer.get_weights())
    out, out_again = layer(x), again(x)
    out, out_again = (getattr(o, "output", getattr(o, "hidden", o)) for o in (out, out_again))
    np.testing.assert_array_equal(numpy(out), numpy(out_again))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: gk.MultiHeadAttention(d_model=10, num_heads=3), "not divisible by num_heads=3"),
        (lambda: gk.MultiHeadAttention(d_model=8, num_heads=2, dropout=1.5), "got 1.5"),
        (lambda: gk.FeedForward(d_model=8, d_ff=16, activation="tanh"), "got 'tanh'"),
        (lambda: gk.FeedForward(d_model=8, d_ff=0), "d_ff must be a positive integer, got 0"),
        (lambda: gk.SinusoidalPositionalEncoding(d_model=7), "even d_model, got 7"),
        (lambda: gk.Encoder(num_layers=0, d_model=8, num_heads=2, d_ff=8), "got 0"),
    ],
)
def test_bad_arguments_are_clear_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_wrong_query_width_is_a_clear_error():
    layer = gk.MultiHeadAttention(d_model=D, num_heads=4)
    with pytest.raises(ValueError, match=r"query must be \(batch, length, 16\), got \(2, 3, 8\)"):
        layer(np.zeros((2, 3, 8), dtype="float32"))
