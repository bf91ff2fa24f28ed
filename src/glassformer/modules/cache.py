"""The key/value cache that makes decoding one token at a time cheap.

Without a cache, producing token t+1 runs the model over all t tokens again. With one,
each attention layer keeps the keys and values it has already computed and only the
newest token is projected and attended from: the same numbers, a fraction of the work.

Shapes: B batch, H heads, T positions so far, Dh head width.

``KVCache`` serves one attention module:
- self-attention appends the new positions' keys and values on every call;
- cross-attention stores the memory's keys and values on the first call and reuses
  them afterwards (the encoder's output does not change while decoding).

``DecoderCache`` holds one ``KVCache`` per layer (two for a decoder layer) and knows how
many positions have been seen, which is where the next token's position starts.
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Keys and values of one attention layer, (B, H, T, Dh) each, grown in place.

    Storage is allocated in blocks and doubled when full, so appending a token copies
    only that token; ``keys``/``values`` are views of the filled part.
    """

    def __init__(self) -> None:
        self._k: Tensor | None = None  # (B, H, capacity, Dh)
        self._v: Tensor | None = None
        self.length = 0

    def __len__(self) -> int:
        return self.length

    @property
    def keys(self) -> Tensor:
        return self._filled(self._k)

    @property
    def values(self) -> Tensor:
        return self._filled(self._v)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the keys/values of new positions (B, H, Tnew, Dh); return all so far."""
        new = k.size(2)
        if self._k is None or self._v is None:
            keys, values = _storage(k, new), _storage(v, new)
        elif self.length + new > self._k.size(2):
            capacity = max(2 * self._k.size(2), self.length + new)
            keys, values = (
                _grow(self._k, self.length, capacity),
                _grow(self._v, self.length, capacity),
            )
        else:
            keys, values = self._k, self._v
        keys[:, :, self.length : self.length + new] = k
        values[:, :, self.length : self.length + new] = v
        self._k, self._v = keys, values
        self.length += new
        return self.keys, self.values

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (B',) in that order: how beam search follows its beams."""
        if self._k is not None and self._v is not None:
            self._k = self._k.index_select(0, index)
            self._v = self._v.index_select(0, index)

    def _filled(self, storage: Tensor | None) -> Tensor:
        if storage is None:
            raise RuntimeError("the cache is empty")
        return storage[:, :, : self.length]


def _storage(x: Tensor, needed: int, block: int = 64) -> Tensor:
    """Empty (B, H, capacity, Dh) storage for ``needed`` positions, rounded up to a block."""
    B, H, _, Dh = x.shape
    capacity = -(-needed // block) * block
    return torch.empty(B, H, capacity, Dh, dtype=x.dtype, device=x.device)


def _grow(storage: Tensor, length: int, capacity: int) -> Tensor:
    B, H, _, Dh = storage.shape
    bigger = storage.new_empty(B, H, capacity, Dh)
    bigger[:, :, :length] = storage[:, :, :length]
    return bigger


class DecoderCache:
    """One ``KVCache`` per layer of a stack (self-attention, and cross-attention if any).

    Args:
        num_layers: layers in the stack.
        cross_attention: also cache each layer's cross-attention keys/values.
    """

    def __init__(self, num_layers: int, *, cross_attention: bool = False) -> None:
        self.self_attn = [KVCache() for _ in range(num_layers)]
        self.cross_attn = [KVCache() for _ in range(num_layers)] if cross_attention else None

    @property
    def length(self) -> int:
        """Positions seen so far: the position the next token takes (without padding)."""
        return self.self_attn[0].length

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` in every layer (cross-attention too)."""
        for cache in self.self_attn + (self.cross_attn or []):
            cache.reorder(index)
