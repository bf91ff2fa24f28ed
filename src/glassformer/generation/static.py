"""Decoding at the weights' pace: a preallocated cache and a one-token step with nothing
else in it.

At batch 1 a decoding step multiplies one token's vector by every weight matrix once; the
matrix-vector products are the work the weights demand, and anything else (building masks
and positions, growing tensors, Python that grows with the sequence) is overhead. This
module's step does the products and the little around them:

- ``static_cache``: each layer's keys and values in buffers allocated once for the whole
  generation, (B, Hkv, capacity, Dh) (``modules.cache.StaticKVCache``), written in place.
  The prompt fills it through the model's forward (fused attention over the prompt, keys
  written straight into the buffers); then every step writes one column.
- ``decode_step``: one token through the model's own forward, with that cache and a mask
  of the slots filled so far. Compiled (``GenerationConfig(compile=True)``), the cache
  hands attention its whole buffers (``use_whole_buffers``), so every tensor the step sees
  has the same shape at every step and ``torch.compile`` compiles it once. Attention over
  the cache runs in float32 on the CPU (see ``static_cache``).

Nothing of the model is spelled out again here: the blocks, the attention and the rotary
angles (computed once per step for every block) are the model's, so a model cast to bf16
or quantised by ``for_inference`` decodes here too. With hooks attached, ``generate``
takes the plain cached path (a hook may change shapes the compiled step fixes).

Shapes: B batch, C capacity (prompt + new tokens), H heads, Hkv key/value heads, Dh head
width, D model width, V vocabulary.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any, cast

import torch
from torch import Tensor, nn

from glassformer.generation.protocols import CausalLM
from glassformer.kernels.gguf_kernels import kernels
from glassformer.modules.attention import MultiHeadAttention
from glassformer.modules.cache import DecoderCache, StaticKVCache
from glassformer.modules.experts import MixtureOfExperts
from glassformer.modules.hooking import hook_points


def static_cache(model: CausalLM, batch: int, capacity: int) -> DecoderCache:
    """A ``DecoderCache`` of ``StaticKVCache``s for a ``GPT``, ``capacity`` positions long.

    On the CPU the keys and values are kept in float32 whatever the model's dtype: PyTorch's
    fused attention kernel, at one query, ran 5-7x slower in bf16 than in fp32 (97 vs 18 µs
    over 272 keys, 678 vs 95 over 2,048; 2-core AMD EPYC, torch 2.13).
    """
    attn = cast(MultiHeadAttention, model.blocks[0].get_submodule("attn"))
    # The token table's own tensor, not its `weight`: a GGUF table decodes itself whole for
    # that (113 MB and 60 ms for SmolLM2's, at every generate call).
    table = next(itertools.chain(model.embed.parameters(), model.embed.buffers()), None)
    device = table.device if table is not None else torch.device("cpu")
    dtype = torch.float32 if table is None or device.type == "cpu" else table.dtype
    return DecoderCache(
        model.num_layers,
        make=lambda: StaticKVCache(
            batch, attn.num_kv_heads, capacity, attn.head_dim, dtype=dtype, device=device
        ),
    )


def use_whole_buffers(cache: DecoderCache) -> None:
    """From now on every layer's cache hands attention its whole storage (the compiled
    step's fixed shapes; the mask leaves out the slots not filled yet)."""
    for layer in cache.self_attn:
        if not isinstance(layer, StaticKVCache):
            raise TypeError(f"expected a static cache, got a {type(layer).__name__}")
        layer.use_whole_buffers()


def can_decode_statically(model: CausalLM) -> str | None:
    """Why ``model`` cannot take the static path (None: it can)."""
    c = model.config
    if getattr(c, "attention_window", None) is not None:
        return "a sliding-window model keeps a rolling cache"
    if any(point.active for point in hook_points(cast(nn.Module, model)).values()):
        return "hooks are attached, and only the plain path calls them"
    return None


def decode_step(
    model: CausalLM, ids: Tensor, positions: Tensor, filled: Tensor | None, cache: DecoderCache
) -> Tensor:
    """One new token per row through ``model`` (a ``GPT``), by its own forward: the
    next-token logits (B, V).

    Args:
        ids: the newest tokens (B, 1).
        positions: their positions (B, 1) (a left-padded row counts its real tokens only).
        filled: (B, 1, 1, Tk) bool, True for the cache slots that hold a real token (this
            step's included): the keys attention may read (None: all it is given).
        cache: from ``static_cache``, with the earlier tokens in it.
    """
    return model(ids, mask=filled, cache=cache, positions=positions).logits[:, -1]


# Each model's compiled step, kept for the model's life (and not on it: a copy of the model
# compiles its own).
COMPILED: weakref.WeakKeyDictionary[CausalLM, Any] = weakref.WeakKeyDictionary()


def compiled_step(model: CausalLM) -> Any:
    """``decode_step`` compiled for ``model`` (once: kept in ``COMPILED``). A mixture of
    experts is refused: each step runs the experts its tokens chose, so its shapes change
    from step to step, and the step is compiled for one set of shapes."""
    if any(isinstance(m, MixtureOfExperts) for m in cast(nn.Module, model).modules()):
        raise ValueError("compile=True does not take a mixture of experts (the experts each "
                         "step runs change its shapes); generate without it")  # fmt: skip
    step = COMPILED.get(model)
    if step is None:
        kernels()  # the C library's one-query attention, built before the graph is traced
        # without the generated code's checks of every input's size and alignment: the step
        # is called with the shapes it was compiled for (the guards saw them), and the checks
        # cost 3% of a SmolLM2 step (366 inputs)
        step = torch.compile(
            decode_step,
            dynamic=False,
            options={"size_asserts": False, "alignment_asserts": False},
        )
        COMPILED[model] = step
    return step
