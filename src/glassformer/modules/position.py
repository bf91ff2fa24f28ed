"""Token embeddings and the two ways to tell the model where a token sits.

Shapes: B batch, T length, D d_model, V vocabulary.

The positional modules share one interface: ``forward(x, start=0)`` takes token
embeddings (B, T, D) and returns them with the positions ``start .. start+T-1`` added;
``rows(x, start)`` gives what is added (the models add it themselves, through their
``hook_pos_embed``).
``start`` lets a decoder continue after tokens it has already seen (KV cache). Rows that
need their own positions (a left-padded batch, whose real tokens start at different
columns) pass ``positions`` (B, T) instead.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class TokenEmbedding(nn.Embedding):
    """Token ids → vectors, optionally scaled by √D as in the paper (section 3.4).

    An ``nn.Embedding`` (its table is ``weight``, (V, D)) that names a token id outside the
    vocabulary instead of failing deep inside the lookup.

    Args:
        vocab_size: V.
        d_model: D.
        scale: multiply by √D (the paper does; GPT and BERT do not).
    """

    def __init__(self, *, vocab_size: int, d_model: int, scale: bool = False) -> None:
        if vocab_size <= 0:
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size}")
        super().__init__(vocab_size, d_model)
        self.scale = math.sqrt(d_model) if scale else 1.0

    def forward(self, ids: Tensor) -> Tensor:
        """(B, T) ids → (B, T, D)."""
        if not torch.compiler.is_compiling():  # a test of values would split a compiled graph
            outside = (ids < 0) | (ids >= self.num_embeddings)
            if outside.any():  # one check, one sync; nn.Embedding's own would not say which
                bad = ids[outside][0].item()
                raise ValueError(
                    f"token id {bad} is outside the vocabulary [0, {self.num_embeddings})"
                )
        x = super().forward(ids)  # (B, T, D)
        return x * self.scale if self.scale != 1.0 else x

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", scale={self.scale:.3g}" if self.scale != 1.0 else "")


class SinusoidalPositionalEncoding(nn.Module):
    """The paper's fixed encoding: PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(...).

    Sine and cosine interleave (even and odd features), as in "Attention Is All You
    Need"; with ``halves`` the sines fill the first half of the features and the cosines the
    second (the same frequencies: tensor2tensor's and Marian's layout). The table is a
    non-persistent buffer: it is recomputed, never saved.

    Args:
        d_model: D (even).
        max_len: longest sequence the table covers.
        halves: sines then cosines, instead of interleaved.
    """

    pe: Tensor  # (max_len, D), a buffer

    def __init__(self, *, d_model: int, max_len: int = 5000, halves: bool = False) -> None:
        super().__init__()
        if d_model <= 0 or d_model % 2:
            raise ValueError(f"sinusoidal encoding needs an even d_model, got {d_model}")
        if max_len <= 0:
            raise ValueError(f"max_len must be a positive integer, got {max_len}")
        self.max_len, self.d_model, self.halves = max_len, d_model, halves
        self.register_buffer("pe", sinusoidal_table(max_len, d_model, halves), persistent=False)

    def reset_buffers(self) -> None:
        """Compute the table again (on the CPU): for a model built on the meta device and
        given its weights afterwards, which do not hold it."""
        self.pe = sinusoidal_table(self.max_len, self.d_model, self.halves)

    def forward(self, x: Tensor, start: int = 0, positions: Tensor | None = None) -> Tensor:
        """(B, T, D) → (B, T, D) with positions start..start+T-1 (or ``positions``) added."""
        return x + self.rows(x, start, positions)

    def rows(self, x: Tensor, start: int = 0, positions: Tensor | None = None) -> Tensor:
        """The encodings ``forward`` adds to ``x`` (B, T, D): (T, D), or (B, T, D) for
        ``positions`` (B, T)."""
        return table_rows(self.pe, x, start, positions)


def table_rows(table: Tensor, x: Tensor, start: int, positions: Tensor | None) -> Tensor:
    """The rows of a fixed ``table`` (max_len, D) for the positions start..start+T-1 of
    ``x`` (B, T, D): (T, D); or for ``positions`` (B, T): (B, T, D). In ``x``'s dtype."""
    if positions is not None:
        check_positions(positions, x, table.size(0))
        return table[positions].to(x.dtype)  # (B, T, D)
    T = x.size(1)
    check_length(start + T, table.size(0))
    return table[start : start + T].to(x.dtype)  # (T, D)


def sinusoidal_table(max_len: int, d_model: int, halves: bool = False) -> Tensor:
    """The (max_len, D) table of the paper's sinusoids, computed in float64 then cast;
    interleaved, or with ``halves`` all sines then all cosines."""
    position = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    angles = position * inv_freq  # (max_len, D/2)
    if halves:
        return torch.cat([angles.sin(), angles.cos()], dim=1).float()
    table = torch.empty(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = angles.sin()
    table[:, 1::2] = angles.cos()
    return table.float()


class LearnedPositionalEmbedding(nn.Embedding):
    """A trained vector per position (Bloem, GPT, BERT): an ``nn.Embedding`` whose table,
    ``weight`` (max_len, D), is indexed by position.

    ``forward(x, start, positions)`` adds the rows to ``x``, as every positional module
    does; ``rows`` gives the rows alone.

    Args:
        max_len: number of positions.
        d_model: D.
    """

    def __init__(self, *, max_len: int, d_model: int) -> None:
        if max_len <= 0:
            raise ValueError(f"max_len must be a positive integer, got {max_len}")
        super().__init__(max_len, d_model)
        self.max_len = max_len

    def forward(self, x: Tensor, start: int = 0, positions: Tensor | None = None) -> Tensor:
        """(B, T, D) → (B, T, D) with positions start..start+T-1 (or ``positions``) added."""
        return x + self.rows(x, start, positions)

    def rows(self, x: Tensor, start: int = 0, positions: Tensor | None = None) -> Tensor:
        """The position vectors for ``x`` (B, T, D): (T, D) for start..start+T-1, or
        (B, T, D) for ``positions`` (B, T)."""
        if positions is not None:
            check_positions(positions, x, self.max_len)
            return F.embedding(positions, self.weight)  # (B, T, D)
        T = x.size(1)
        check_length(start + T, self.max_len)
        return self.weight[start : start + T]  # (T, D), broadcast over B


POSITIONAL: dict[str, Callable[..., nn.Module]] = {
    "sinusoidal": SinusoidalPositionalEncoding,
    "sinusoidal_halves": functools.partial(SinusoidalPositionalEncoding, halves=True),
    "learned": LearnedPositionalEmbedding,
}


def positional_encoding(kind: str, *, d_model: int, max_len: int) -> nn.Module:
    """Build the positional module named by a config's ``positional`` value."""
    if kind not in POSITIONAL:
        raise ValueError(f"positional must be one of {sorted(POSITIONAL)}, got {kind!r}")
    return POSITIONAL[kind](d_model=d_model, max_len=max_len)


def check_length(length: int, max_len: int) -> None:
    if length > max_len:
        raise ValueError(
            f"sequence of length {length} is longer than the model's max_len={max_len}"
        )


def check_positions(positions: Tensor, x: Tensor, max_len: int) -> None:
    """Explicit positions must be (B, T) like ``x`` and lie in [0, max_len)."""
    if positions.shape != x.shape[:2]:
        raise ValueError(
            f"positions must be (batch, length) = {tuple(x.shape[:2])}, "
            f"got {tuple(positions.shape)}"
        )
    if torch.compiler.is_compiling():  # the value test below would split a compiled graph
        return
    if positions.numel() and (positions.min() < 0 or positions.max() >= max_len):
        raise ValueError(
            f"positions must lie in [0, {max_len}), got {positions.min().item()}.."
            f"{positions.max().item()}"
        )
