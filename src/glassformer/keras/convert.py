"""Weights between a glassformer PyTorch model and its Keras twin, both ways.

The two trees have the same names, so the map is structural: every PyTorch leaf module
with weights (``blocks.0.attn.qkv_proj``) has a Keras layer at the same
path, and the three kinds of leaf convert as

    nn.Linear     weight (out, in), bias   ↔  Dense               kernel (in, out), bias
    nn.LayerNorm  weight, bias             ↔  LayerNormalization  gamma, beta
    nn.Embedding  weight (V, D)            ↔  Embedding           embeddings (V, D)

Every weight on both sides must be matched, or the copy fails naming the path.
"""

from __future__ import annotations

from typing import Any, cast

import keras
import numpy as np
import torch
from torch import nn

from glassformer.keras.classifier import TransformerClassifier
from glassformer.keras.encoder_lm import EncoderLM
from glassformer.models import EncoderLM as TorchEncoderLM
from glassformer.models import TransformerClassifier as TorchClassifier
from glassformer.models.base import PretrainedModel
from glassformer.modules.norms import LayerNorm
from glassformer.modules.position import LearnedPositionalEmbedding, TokenEmbedding

# model kind → (Keras twin, PyTorch model)
TWINS: dict[str, tuple[type, type]] = {
    "classifier": (TransformerClassifier, TorchClassifier),
    "encoder_lm": (EncoderLM, TorchEncoderLM),
}

# PyTorch leaf type → (Keras layer type, [(torch name, keras name, transpose)])
_LEAVES: dict[type, tuple[type, list[tuple[str, str, bool]]]] = {
    nn.Linear: (keras.layers.Dense, [("weight", "kernel", True), ("bias", "bias", False)]),
    nn.LayerNorm: (
        keras.layers.LayerNormalization,
        [("weight", "gamma", False), ("bias", "beta", False)],
    ),
    nn.Embedding: (keras.layers.Embedding, [("weight", "embeddings", False)]),
}
_LEAVES[LayerNorm] = _LEAVES[nn.LayerNorm]  # glassformer's: nn.LayerNorm with a hook point
_LEAVES[TokenEmbedding] = _LEAVES[nn.Embedding]  # glassformer's: nn.Embeddings that check ids
_LEAVES[LearnedPositionalEmbedding] = _LEAVES[nn.Embedding]  # or add rows to the stream


def from_torch(model: PretrainedModel) -> keras.Model:
    """The Keras twin of a glassformer ``TransformerClassifier`` or ``EncoderLM``, same weights."""
    keras_cls, _ = _twins(model)
    twin = keras_cls(model.config)
    twin.build((None, None))
    copy_from_torch(twin, model)
    return twin


def to_torch(keras_model: keras.Model) -> nn.Module:
    """The glassformer PyTorch model of a Keras twin, same weights, in eval mode."""
    _, torch_cls = _twins(keras_model)
    model = torch_cls(keras_model.config)
    copy_to_torch(keras_model, model)
    return model.eval()


def copy_from_torch(keras_layer: keras.layers.Layer, module: nn.Module) -> None:
    """Copy a PyTorch module's weights into its (built) Keras twin, in place."""
    for weight, variable, transpose in _weights(keras_layer, module):
        value = weight.detach().cpu().numpy()
        variable.assign(value.T if transpose else value)


def copy_to_torch(keras_layer: keras.layers.Layer, module: nn.Module) -> None:
    """Copy a Keras layer's weights into its PyTorch twin, in place."""
    with torch.no_grad():
        for weight, variable, transpose in _weights(keras_layer, module):
            value = np.asarray(keras.ops.convert_to_numpy(variable))
            weight.copy_(torch.from_numpy(value.T if transpose else value))


def _weights(keras_layer: keras.layers.Layer, module: nn.Module):
    """(PyTorch parameter, Keras variable, whether to transpose) for every weight."""
    for path, leaf, target in _pairs(keras_layer, module):
        for torch_name, keras_name, transpose in _LEAVES[type(leaf)][1]:
            weight = getattr(leaf, torch_name)
            variable = getattr(target, keras_name, None) if weight is not None else None
            if (weight is None) != (variable is None):
                side = "PyTorch" if weight is not None else "Keras"
                raise ValueError(f"{path}.{torch_name} exists only in {side}")
            if weight is not None:
                yield weight, variable, transpose


def _pairs(keras_layer: keras.layers.Layer, module: nn.Module):
    """(path, PyTorch leaf, Keras layer) for every PyTorch leaf with weights."""
    if not keras_layer.built:
        raise ValueError(f"build the Keras layer {keras_layer.name!r} before copying weights")
    pairs: list[tuple[str, nn.Module, Any]] = []
    seen: set[int] = set()
    for path, leaf in module.named_modules():
        if not any(True for _ in leaf.parameters(recurse=False)):
            continue
        if type(leaf) not in _LEAVES:
            raise ValueError(f"no Keras twin for {type(leaf).__name__} at {path!r}")
        target: Any = _sublayer(keras_layer, path)
        expected = _LEAVES[type(leaf)][0]
        if not isinstance(target, expected):
            raise ValueError(
                f"{path!r} is a {type(leaf).__name__} in PyTorch but a "
                f"{type(target).__name__} in Keras (expected {expected.__name__})"
            )
        pairs.append((path, leaf, target))
        seen.update(id(v) for v in cast(Any, target).weights)
    weights: Any = keras_layer.weights
    unmatched = [v.path for v in weights if id(v) not in seen]
    if unmatched:
        raise ValueError(f"Keras weights with no PyTorch twin: {unmatched}")
    return pairs


def _sublayer(layer: Any, path: str) -> Any:
    """The Keras layer at a PyTorch module path: attributes, and list indices for stacks."""
    for part in path.split(".") if path else []:
        layer = layer[int(part)] if part.isdigit() else getattr(layer, part, None)
        if layer is None:
            raise ValueError(f"the Keras twin has no layer at {path!r}")
    return layer


def _twins(model: PretrainedModel) -> tuple[type, type]:
    kind = getattr(model, "kind", None)
    if kind not in TWINS:
        raise ValueError(
            f"no Keras twin for {type(model).__name__} (kind {kind!r}); "
            f"supported kinds: {sorted(TWINS)}"
        )
    return TWINS[kind]
