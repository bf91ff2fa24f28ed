"""The key/value cache that makes decoding one token at a time cheap.

Without a cache, producing token t+1 runs the model over all t tokens again. With one,
each attention layer keeps the keys and values it has already computed and only the
newest token is projected and attended from: the same numbers, a fraction of the work.

Shapes: B batch, H heads, T positions so far, Dh head width.

``KVCache`` serves one attention module:
- self-attention appends the new positions' keys and values on every call;
- cross-attention stores the memory's keys and values on the first call and reuses
  them afterwards (the encoder's output does not change while decoding).

``RollingKVCache`` serves a sliding-window layer (``MultiHeadAttention(window=(w, 0))``): it
keeps only the last w positions (and the global tokens), so its memory stays constant however
long decoding goes on.

``StaticKVCache`` is allocated once for a whole generation and written in place: what the
one-token decoding step (``glassformer.generation.static``) runs with.

``DecoderCache`` holds one ``KVCache`` per layer (two for a decoder layer) and knows how
many positions have been seen, which is where the next token's position starts.
"""

from __future__ import annotations

from collections.abc import Callable

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
        self._length = 0

    @property
    def length(self) -> int:
        """Positions appended so far."""
        return self._length

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
        self._length += new
        return self.keys, self.values

    @property
    def key_positions(self) -> Tensor:
        """The positions (Tk,) of the keys the last ``append`` returned: all of them here."""
        device = None if self._k is None else self._k.device
        return torch.arange(self.length, device=device)

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


class RollingKVCache(KVCache):
    """Keys and values of a causal sliding-window layer: the first ``keep_first`` positions
    (global tokens) and the last ``window``, nothing older.

    A query at position i with window (w, 0) reads keys i − w .. i. ``append`` returns the kept
    keys and the new ones (so each new query finds its whole window), then keeps the last w:
    the window of the next position, whose own key comes with it.

    Args:
        window: w, the layer's reach to the left.
        keep_first: global tokens, kept for good.
    """

    def __init__(self, window: int, keep_first: int = 0) -> None:
        super().__init__()
        if window < 0 or keep_first < 0:
            raise ValueError(f"window and keep_first must be >= 0, got {window}, {keep_first}")
        self.window = window
        self.keep_first = keep_first
        self._positions: Tensor | None = None  # (n,) positions of the kept keys
        self._returned: Tensor | None = None  # (Tk,) positions of the keys append returned

    @property
    def key_positions(self) -> Tensor:
        if self._returned is None:
            raise RuntimeError("the cache is empty")
        return self._returned

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the keys/values of new positions (B, H, Tnew, Dh); return the kept ones and
        these, (B, H, Tk, Dh) each."""
        new = torch.arange(self.length, self.length + k.size(2), device=k.device)
        if self._k is None or self._v is None or self._positions is None:
            keys, values, positions = k, v, new
        else:
            keys, values = torch.cat([self._k, k], dim=2), torch.cat([self._v, v], dim=2)
            positions = torch.cat([self._positions, new])
        self._length += k.size(2)
        self._returned = positions
        keep = (positions < self.keep_first) | (positions >= self.length - self.window)
        self._k, self._v, self._positions = keys[:, :, keep], values[:, :, keep], positions[keep]
        return keys, values

    def _filled(self, storage: Tensor | None) -> Tensor:
        """All of it: the storage holds only the kept positions."""
        if storage is None:
            raise RuntimeError("the cache is empty")
        return storage


class StaticKVCache(KVCache):
    """Keys and values in storage allocated once, (B, Hkv, capacity, Dh), written in place:
    nothing grows while decoding, and going past the capacity is an error.

    ``append`` writes after the positions filled so far and returns the filled part of the
    storage. With ``whole = True`` (``use_whole_buffers``) it writes at ``slot``, a tensor it
    moves on in place, and returns the whole storage, filled or not: every step then sees
    the same shapes, with no Python number changing (``torch.compile`` compiles the step
    once), and the caller's mask leaves out the slots not filled yet. The storage may be
    wider than the model (``static_cache`` keeps float32 under a bf16 model on the CPU): the
    attention then runs in the storage's dtype.
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
        self.slot = torch.zeros(1, dtype=torch.long, device=device)  # where the next key goes
        self.whole = False

    @property
    def length(self) -> int:
        return int(self.slot) if self.whole else self._length

    def use_whole_buffers(self) -> None:
        """From now on hand attention the whole storage (see the class notes)."""
        self.slot.fill_(self._length)
        self.whole = True

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        assert self._k is not None and self._v is not None
        new = k.size(2)
        if not self.whole and self._length + new > self.capacity:
            raise ValueError(
                f"the static cache holds {self.capacity} positions; {self._length} are "
                f"filled and {new} more came"
            )
        if k.dtype != self._k.dtype:
            k, v = k.to(self._k.dtype), v.to(self._v.dtype)
        if self.whole:  # no Python number changes here: a compiled step stays one graph
            index = self.slot if new == 1 else self.slot + torch.arange(new, device=k.device)
            self._k.index_copy_(2, index, k)  # (new,) slots along the positions
            self._v.index_copy_(2, index, v)
            self.slot.add_(new)
            return self._k, self._v
        start, self._length = self._length, self._length + new
        self._k[:, :, start : self._length] = k
        self._v[:, :, start : self._length] = v
        return self._k[:, :, : self._length], self._v[:, :, : self._length]

    @property
    def buffers(self) -> tuple[Tensor, Tensor]:
        """The whole key and value storage, (B, Hkv, C, Dh) each, filled or not."""
        assert self._k is not None and self._v is not None
        return self._k, self._v


class DecoderCache:
    """One ``KVCache`` per layer of a stack (self-attention, and cross-attention if any).

    Args:
        num_layers: layers in the stack.
        cross_attention: also cache each layer's cross-attention keys/values.
        window: the self-attention's reach to the left w, for sliding-window layers
            (``window=(w, 0)``): each layer's cache is then a ``RollingKVCache``.
        windows: each layer's own reach (None: a full cache), where layers differ (Gemma's
            sliding and global layers); instead of ``window``.
        global_tokens: with a window, the global tokens each rolling cache keeps.
        make: builds each layer's self-attention cache instead (the static decoding path's
            preallocated ``StaticKVCache``).
    """

    def __init__(
        self,
        num_layers: int,
        *,
        cross_attention: bool = False,
        window: int | None = None,
        windows: list[int | None] | None = None,
        global_tokens: int = 0,
        make: Callable[[], KVCache] | None = None,
    ) -> None:
        if windows is None:
            windows = [window] * num_layers
        if len(windows) != num_layers:
            raise ValueError(f"{len(windows)} windows for {num_layers} layers")

        def layer_cache(w: int | None) -> KVCache:
            if make is not None:
                return make()
            return KVCache() if w is None else RollingKVCache(w, global_tokens)

        self.self_attn: list[KVCache] = [layer_cache(w) for w in windows]
        self.cross_attn = [KVCache() for _ in range(num_layers)] if cross_attention else None

    @property
    def length(self) -> int:
        """Positions seen so far: the position the next token takes (without padding)."""
        return self.self_attn[0].length

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` in every layer (cross-attention too)."""
        for cache in self.self_attn + (self.cross_attn or []):
            cache.reorder(index)
