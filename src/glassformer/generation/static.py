"""Decoding at the weights' pace: a preallocated cache and a one-token step with nothing
else in it.

At batch 1 a decoding step multiplies one token's vector by every weight matrix once; the
matrix-vector products are the work the weights demand, and anything else (building masks
and positions, growing tensors, Python that grows with the sequence) is overhead. This
module's step does the products and the little around them:

- ``StaticKVCache``: each layer's keys and values in buffers allocated once for the whole
  generation, (B, Hkv, capacity, Dh), written in place. The prompt fills it through the
  model's ordinary forward (fused attention over the prompt, keys written straight into the
  buffers); then every step writes one column.
- ``decode_step``: one token through every block, spelled out below: norm, one fused qkv
  product, rotary, write k and v at the step's slot, fused attention over the whole buffer
  under a key mask (the slots filled so far), the output product, the residual, the
  feed-forward. Every tensor it sees has the same shape at every step, so
  ``torch.compile`` compiles it once (``GenerationConfig(compile=True)``). Attention over
  the cache runs in float32 on the CPU (see ``static_cache``).

It runs the model's own modules (norms, projections, feed-forward), so a model cast to
bf16 or quantised by ``for_inference`` decodes here too. Hook points are not called on
this path: with hooks attached, ``generate`` takes the plain cached path, which calls them.

Shapes: B batch, C capacity (prompt + new tokens), H heads, Hkv key/value heads, Dh head
width, D model width, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from glassformer.modules.cache import DecoderCache, KVCache
from glassformer.modules.hooks import hook_points


class StaticKVCache(KVCache):
    """A ``KVCache`` whose storage, (B, Hkv, capacity, Dh), is allocated up front and never
    grows: appending writes in place; going past the capacity is an error.

    The storage may be float32 under a bf16 model (``static_cache`` does that on the CPU):
    ``append`` then returns the keys in the caller's dtype.
    """

    def __init__(
        self,
        batch: int,
        num_kv_heads: int,
        capacity: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        super().__init__()
        shape = (batch, num_kv_heads, capacity, head_dim)
        self._k = torch.zeros(shape, dtype=dtype, device=device)
        self._v = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.length + k.size(2) > self.capacity:
            raise ValueError(
                f"the static cache holds {self.capacity} positions; {self.length} are filled "
                f"and {k.size(2)} more came"
            )
        keys, values = super().append(k, v)
        return keys.to(k.dtype), values.to(v.dtype)  # as they came (a copy only if cast)

    @property
    def buffers(self) -> tuple[Tensor, Tensor]:
        """The whole key and value storage, (B, Hkv, C, Dh) each, filled or not."""
        assert self._k is not None and self._v is not None
        return self._k, self._v


def static_cache(model: Any, batch: int, capacity: int) -> DecoderCache:
    """A ``DecoderCache`` of ``StaticKVCache``s for a ``GPT``, ``capacity`` positions long.

    On the CPU the keys and values are kept in float32 whatever the model's dtype: PyTorch's
    fused attention kernel, at one query, ran 5-7x slower in bf16 than in fp32 (97 vs 18 µs
    over 272 keys, 678 vs 95 over 2,048; 2-core AMD EPYC, torch 2.13).
    """
    c = model.config
    attn = model.blocks.layers[0].self_attn
    weight = model.embed.token.embedding.weight  # the activations' dtype (quantised too)
    dtype = torch.float32 if weight.device.type == "cpu" else weight.dtype
    return DecoderCache(
        c.num_layers,
        make=lambda: StaticKVCache(
            batch, attn.num_kv_heads, capacity, attn.head_dim, dtype=dtype, device=weight.device
        ),
    )


def cache_buffers(cache: DecoderCache) -> tuple[list[Tensor], list[Tensor]]:
    """Every layer's key and value storage of a ``static_cache``."""
    keys, values = [], []
    for layer in cache.self_attn:
        if not isinstance(layer, StaticKVCache):
            raise TypeError(f"expected a static cache, got a {type(layer).__name__}")
        k, v = layer.buffers
        keys.append(k)
        values.append(v)
    return keys, values


def can_decode_statically(model: Any) -> str | None:
    """Why ``model`` cannot take the static path (None: it can)."""
    c = model.config
    if getattr(c, "attention_window", None) is not None:
        return "a sliding-window model keeps a rolling cache"
    if any(point.active for point in hook_points(model).values()):
        return "hooks are attached, and only the plain path calls them"
    return None


def decode_step(
    model: Any,
    ids: Tensor,
    positions: Tensor,
    slot: Tensor,
    key_bias: Tensor,
    keys: Sequence[Tensor],
    values: Sequence[Tensor],
) -> Tensor:
    """One new token per row through ``model`` (a ``GPT``): next-token logits (B, V).

    Args:
        ids: the newest tokens (B, 1).
        positions: their positions (B, 1) (a left-padded row counts its real tokens only).
        slot: the cache column they are written to, (1,).
        key_bias: (B, 1, 1, C) in the cache's dtype, added to the scores: 0 for the columns
            filled so far (this step's included), -inf for the rest. (A boolean mask would
            be turned into this inside the kernel, at every call.)
        keys, values: each layer's ``StaticKVCache.buffers``, written at ``slot``.
    """
    x = model.embed(ids, 0, positions)  # (B, 1, D)
    rotary = model.blocks.layers[0].self_attn.rotary  # one for every layer
    if rotary is not None:  # the angles of this step's position, once for all the layers
        cos, sin = rotary.cos_sin(positions, x.dtype)
    for layer, k_cache, v_cache in zip(model.blocks.layers, keys, values, strict=True):
        attn = layer.self_attn
        B, H, Hkv, Dh = ids.size(0), attn.num_heads, attn.num_kv_heads, attn.head_dim
        qkv = attn.qkv_proj(layer._in(x, layer.norm1))  # (B, 1, (H + 2·Hkv)·Dh)
        q, k, v = qkv.split([H * Dh, Hkv * Dh, Hkv * Dh], dim=-1)
        q = q.view(B, 1, H, Dh).transpose(1, 2)  # (B, H, 1, Dh)
        k = k.view(B, 1, Hkv, Dh).transpose(1, 2)  # (B, Hkv, 1, Dh)
        v = v.view(B, 1, Hkv, Dh).transpose(1, 2)
        if rotary is not None:
            q, k = rotary.rotate(q, cos, sin), rotary.rotate(k, cos, sin)
        k_cache.index_copy_(2, slot, k.to(k_cache.dtype))
        v_cache.index_copy_(2, slot, v.to(v_cache.dtype))
        z = F.scaled_dot_product_attention(
            q.to(k_cache.dtype), k_cache, v_cache, attn_mask=key_bias, enable_gqa=Hkv != H
        )  # (B, H, 1, Dh)
        out = attn.out_proj(z.transpose(1, 2).reshape(B, 1, H * Dh).to(x.dtype))
        x = layer._out(x, out, layer.norm1)
        x = layer._out(x, layer.feed_forward(layer._in(x, layer.norm2)), layer.norm2)
    if model.blocks.norm is not None:
        x = model.blocks.norm(x)
    return model.lm_head(x)[:, -1]  # (B, V)


def compiled_step(model: Any) -> Any:
    """``decode_step`` compiled for ``model`` (once; kept on the model)."""
    step = model.__dict__.get("_compiled_decode_step")
    if step is None:
        step = torch.compile(decode_step, dynamic=False)
        model.__dict__["_compiled_decode_step"] = step
    return step
