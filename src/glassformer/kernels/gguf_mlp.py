"""The gated MLP of a model decoding from GGUF blocks: its gate and up products in one layer.

A decoding step multiplies a few rows; two GGUF products of ``d_ff`` outputs each cost two
calls into the C library, one product of ``2·d_ff`` outputs costs one. So where a model
computes from a file's blocks, ``for_inference`` swaps each ``modules.GatedFeedForward`` whose
gate and up projections are both ``GGUFLinear`` (and have no bias) for this subclass: the
same layers, hook points and activation, plus ``gate_up``, the two projections' blocks
stacked. ``gate_proj`` and ``up_proj`` stay (what reads their weights finds them), sharing
their stored rows with ``gate_up`` (one copy of each).
"""

from __future__ import annotations

from torch import Tensor, nn

from glassformer.kernels.gguf_linear import GGUFLinear
from glassformer.modules.feedforward import GatedFeedForward


class FusedGatedFeedForward(GatedFeedForward):
    """``GatedFeedForward`` computing ``gate_proj`` and ``up_proj`` as one GGUF product."""

    gate_up: GGUFLinear

    @classmethod
    def fuse(cls, mlp: GatedFeedForward, rounded: bool = False) -> FusedGatedFeedForward | None:
        """``mlp`` with its gate and up products fused, sharing its layers and hook points;
        None where they are not both bias-free ``GGUFLinear`` layers."""
        gate, up = mlp.gate_proj, mlp.up_proj
        if not (isinstance(gate, GGUFLinear) and isinstance(up, GGUFLinear)):
            return None
        if gate.bias is not None or up.bias is not None:
            return None
        fused = cls.__new__(cls)
        nn.Module.__init__(fused)
        fused.__dict__.update(
            {k: v for k, v in mlp.__dict__.items() if k not in nn.Module().__dict__}
        )
        for name, child in mlp.named_children():
            fused.add_module(name, child)
        # their rows as they keep them, shared: no second copy
        fused.gate_up = GGUFLinear(gate.stored() + up.stored(), up.in_features, rounded=rounded)
        fused.training = mlp.training
        return fused

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, D) → (B, T, D), as ``GatedFeedForward`` computes it."""
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # (B, T, d_ff) each
        gate = self.hook_pre(gate)
        hidden = self.hook_post(self._act(gate) * self.hook_pre_linear(up))
        return self.down_proj(self.dropout(hidden) if self.training else hidden)
