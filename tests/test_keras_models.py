"""The Keras classifier and encoder LM: the PyTorch models' numbers with transferred weights,
weights both ways unchanged, and the .keras format round trip."""

import keras
import numpy as np
import pytest
import torch

import glassformer.keras as gk
from glassformer import GPT, ClassifierConfig, EncoderLM, EncoderLMConfig, GPTConfig
from glassformer import TransformerClassifier as TorchClassifier

# Keras's torch backend calls np.array(tensor, copy=False), which torch's __array__ predates
# (and one torch thread: on a busy 2-core machine two make these small steps many times slower)
pytestmark = [
    pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning"),
    pytest.mark.usefixtures("one_thread"),
]


ATOL = 1e-5
IDS = torch.tensor(
    [
        [5, 6, 7, 8, 9, 10, 11, 12],
        [5, 6, 7, 0, 0, 0, 0, 0],  # padded
        [13, 0, 0, 0, 0, 0, 0, 0],  # one real token
    ]
)


def numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def randomised(model):
    """A model whose LayerNorms and biases are not at their initial 1s and 0s."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def classifier(**overrides):
    values = dict(vocab_size=40, num_classes=3, max_len=8, d_model=16, num_heads=4, d_ff=32)
    return randomised(TorchClassifier(ClassifierConfig(**{**values, "num_layers": 2, **overrides})))


CLASSIFIERS = {
    "post-norm mean": {},
    "pre-norm mean": dict(norm_first=True),
    "wide heads max gelu": dict(
        num_heads=2, head_dim=16, qkv_bias=False, pooling="max", activation="gelu"
    ),
    "pre-norm cls sinusoidal": dict(norm_first=True, pooling="cls", positional="sinusoidal"),
    "scaled embeddings, no pad id": dict(scale_embeddings=True, pad_id=None),
}


@pytest.mark.parametrize("name", list(CLASSIFIERS))
def test_classifier_equals_pytorch_on_a_padded_batch(name):
    model = classifier(**CLASSIFIERS[name])
    twin = gk.from_torch(model)
    want = model(IDS).logits.detach().numpy()
    got = numpy(twin(IDS.numpy(), training=False))
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_encoder_lm_equals_pytorch_on_a_padded_batch(norm_first):
    config = EncoderLMConfig.preset(
        "tiny", vocab_size=40, max_len=8, d_model=16, num_heads=2, norm_first=norm_first
    )
    model = randomised(EncoderLM(config))
    want = model(IDS).logits.detach().numpy()
    got = numpy(gk.from_torch(model)(IDS.numpy(), training=False))
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


def test_bloem_sized_classifier_equals_pytorch():
    """The source material's classifier (4,081,930 parameters): 6 layers of 8 wide heads."""
    model = randomised(TorchClassifier(ClassifierConfig.preset("bloem")))
    twin = gk.from_torch(model)
    assert twin.count_params() == model.num_parameters() == 4_081_930
    ids = torch.randint(1, 1000, (4, 100), generator=torch.Generator().manual_seed(0))
    ids[1, 40:] = 0
    ids[2, 3:] = 0
    want = model(ids).logits.detach().numpy()
    np.testing.assert_allclose(numpy(twin(ids.numpy(), training=False)), want, rtol=0, atol=ATOL)


def test_weights_survive_torch_to_keras_to_torch_unchanged():
    model = classifier(norm_first=True, num_heads=2, head_dim=16, qkv_bias=False)
    back = gk.to_torch(gk.from_torch(model))
    assert type(back) is TorchClassifier and back.config == model.config
    want = model.state_dict()
    assert back.state_dict().keys() == want.keys()
    for name, value in back.state_dict().items():
        assert torch.equal(value, want[name]), name


def test_a_keras_model_moves_to_torch_with_its_numbers():
    config = ClassifierConfig(
        vocab_size=40,
        num_classes=2,
        max_len=8,
        d_model=16,
        num_heads=4,
        num_layers=1,
        d_ff=32,
        pooling="max",
    )
    twin = gk.TransformerClassifier(config)
    twin.build((None, None))
    model = gk.to_torch(twin)
    want = numpy(twin(IDS.numpy(), training=False))
    np.testing.assert_allclose(model(IDS).logits.detach().numpy(), want, rtol=0, atol=ATOL)


def test_keras_file_round_trip_gives_identical_outputs(tmp_path):
    twin = gk.from_torch(classifier(norm_first=True, pooling="max", positional="sinusoidal"))
    path = tmp_path / "classifier.keras"
    twin.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded) is gk.TransformerClassifier and loaded.config == twin.config
    want = numpy(twin(IDS.numpy(), training=False))
    np.testing.assert_array_equal(numpy(loaded(IDS.numpy(), training=False)), want)

    lm = gk.from_torch(randomised(EncoderLM(EncoderLMConfig.preset("tiny", vocab_size=40))))
    lm.save(tmp_path / "lm.keras")
    loaded = keras.saving.load_model(tmp_path / "lm.keras")
    want = numpy(lm(IDS.numpy(), training=False))
    np.testing.assert_array_equal(numpy(loaded(IDS.numpy(), training=False)), want)


def test_model_config_round_trip():
    twin = gk.from_torch(classifier(pooling="cls"))
    again = gk.TransformerClassifier.from_config(twin.get_config())
    assert again.config == twin.config and again.get_config() == twin.get_config()


def test_a_windowed_model_is_refused_by_from_torch_and_by_its_config():
    windowed = classifier(attention_window=2, global_tokens=1)
    message = "the Keras twin attends densely; this model has attention_window=2"
    with pytest.raises(ValueError, match=message):
        gk.from_torch(windowed)
    with pytest.raises(ValueError, match=message):
        gk.TransformerClassifier(windowed.config)


def test_models_without_a_twin_and_tied_weights_are_refused():
    gpt = GPT(GPTConfig.preset("tiny", vocab_size=20, max_len=8))
    with pytest.raises(ValueError, match="no Keras twin for GPT"):
        gk.from_torch(gpt)
    with pytest.raises(ValueError, match="tie_weights=True"):
        gk.EncoderLM(EncoderLMConfig.preset("tiny", vocab_size=20, tie_weights=True))
    with pytest.raises(
        ValueError, match="sequence of length 9 is longer than the model's max_len=8"
    ):
        gk.from_torch(classifier())(np.ones((1, 9), dtype="int32"))
