"""Relative position buckets (T5, Raffel et al. 2020): positions as a bias on the scores.

Instead of adding a position vector to each token, T5 adds to every attention score a
learned scalar for the distance between query and key, one per head. Distances are put in
buckets: each of the first ``num_buckets / 2`` distances (a quarter, when the attention
looks both ways) has its own bucket, the longer ones share logarithmically wider buckets,
and everything beyond ``max_distance`` shares the last. A bidirectional stack (the encoder)
gives keys before and after the query separate halves of the buckets; a causal one (the
decoder) sees only keys before.

Shapes: H heads, Tq queries, Tk keys; the bias is (1, H, Tq, Tk), computed once per forward
and added by every layer's self-attention (the first layer of a T5 stack owns the table).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def relative_bucket(
    distance: Tensor, *, bidirectional: bool, num_buckets: int, max_distance: int
) -> Tensor:
    """The bucket of each key − query ``distance`` (an integer tensor), as T5 computes it."""
    bucket = torch.zeros_like(distance)
    if bidirectional:
        num_buckets //= 2
        bucket += (distance > 0).long() * num_buckets  # keys after the query: the upper half
        distance = distance.abs()
    else:
        distance = -distance.clamp(max=0)  # keys after the query (masked anyway) → 0
    exact = num_buckets // 2  # distances below this have a bucket each
    far = exact + (
        torch.log(distance.float().clamp(min=1) / exact)
        / math.log(max_distance / exact)
        * (num_buckets - exact)
    ).to(torch.long)
    far = far.clamp(max=num_buckets - 1)
    return bucket + torch.where(distance < exact, distance, far)


class RelativePositionBias(nn.Module):
    """A learned bias per head for each bucket of query–key distances.

    Args:
        num_heads: H.
        num_buckets: how many distance buckets (T5: 32).
        max_distance: the distance from which all share the last bucket (T5: 128).
        bidirectional: keys before and after the query are told apart (an encoder).
    """

    def __init__(
        self, num_heads: int, *, num_buckets: int = 32, max_distance: int = 128,
        bidirectional: bool = True,
    ) -> None:  # fmt: skip
        super().__init__()
        if num_buckets < 4 or max_distance < num_buckets // 2:
            raise ValueError(
                f"num_buckets must be >= 4 and max_distance >= num_buckets / 2, got "
                f"{num_buckets} and {max_distance}"
            )
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bidirectional = bidirectional
        self.embedding = nn.Embedding(num_buckets, num_heads)  # (buckets, H)

    def forward(self, queries: int, keys: int, start: int = 0) -> Tensor:
        """The bias of ``queries`` positions start..start+queries−1 against keys 0..keys−1:
        (1, H, Tq, Tk)."""
        device = self.embedding.weight.device
        query_pos = torch.arange(start, start + queries, device=device)[:, None]
        key_pos = torch.arange(keys, device=device)[None, :]
        buckets = relative_bucket(
            key_pos - query_pos, bidirectional=self.bidirectional,
            num_buckets=self.num_buckets, max_distance=self.max_distance,
        )  # (Tq, Tk)  # fmt: skip
        return self.embedding(buckets).permute(2, 0, 1)[None]

    def extra_repr(self) -> str:
        way = "bidirectional" if self.bidirectional else "causal"
        return f"buckets={self.num_buckets}, max_distance={self.max_distance}, {way}"
