"""The Keras 3 twin of glassformer's encoder: the same blocks, the same weights, the same numbers.

    import glassformer.keras as gk

    keras_model = gk.from_torch(torch_model)   # a TransformerClassifier or EncoderLM
    torch_model = gk.to_torch(keras_model)      # and back; the state dict is unchanged

Every layer mirrors a PyTorch module of ``glassformer.modules`` by class name and by the
names of its sub-layers (``blocks.0.attn.qkv_proj``, ``mlp.linear1``, ``ln1``...),
so moving weights is a name map and a transpose. The layers use ``keras.ops`` only, so
they run on any Keras backend; this package picks the torch backend when the user has not
chosen one (``KERAS_BACKEND``), so it needs neither TensorFlow nor JAX.

Masks are explicit arguments with glassformer's convention (boolean, True = may attend,
broadcastable to (B, H, Tq, Tk)). They are called ``attention_mask``, as in Keras and
keras-hub, not ``mask``: Keras fills an argument named ``mask`` with its own implicit
(B, T) masks, which mean something else.

The core package never imports Keras; only ``glassformer.keras`` does (extra ``keras``).
"""

import importlib.util
import os

if importlib.util.find_spec("keras") is None:
    raise ImportError("glassformer.keras needs Keras 3: pip install 'glassformer[keras]'")
os.environ.setdefault("KERAS_BACKEND", "torch")  # respect a backend the user chose

from glassformer.keras.attention import MultiHeadAttention, scaled_dot_product_attention
from glassformer.keras.block import Encoder, EncoderLayer
from glassformer.keras.classifier import TransformerClassifier
from glassformer.keras.common import EncoderModel
from glassformer.keras.convert import copy_from_torch, copy_to_torch, from_torch, to_torch
from glassformer.keras.encoder_lm import EncoderLM
from glassformer.keras.feedforward import FeedForward
from glassformer.keras.masks import causal_mask, padding_mask
from glassformer.keras.position import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
)

__all__ = [
    "Encoder",
    "EncoderLM",
    "EncoderLayer",
    "EncoderModel",
    "FeedForward",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "SinusoidalPositionalEncoding",
    "TokenEmbedding",
    "TransformerClassifier",
    "causal_mask",
    "copy_from_torch",
    "copy_to_torch",
    "from_torch",
    "padding_mask",
    "scaled_dot_product_attention",
    "to_torch",
]
