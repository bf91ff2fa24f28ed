"""Weight-only quantised linear layers: the weights stored in 8 or 4 bits, the activations
left as they are.

Decoding one token reads every weight once and does little arithmetic with each, so its
time is mostly the bytes of the weights. Storing them in int8 (one scale per output row)
or int4 (a scale and a zero per group of input columns) reads a quarter or an eighth of
fp32's bytes. The matrix products are PyTorch's own CPU kernels
(``aten._weight_int8pack_mm``, ``aten._weight_int4pack_mm_for_cpu``); elsewhere the
weight is dequantised on the fly (correct, not fast).

Shapes: N output features, K input features, G the int4 group size (K / G groups).

    >>> layer = Int8Linear.from_linear(nn.Linear(384, 1536))
    >>> layer(torch.randn(2, 384)).shape
    torch.Size([2, 1536])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

INT4_GROUP_SIZES = (32, 64, 128, 256)
GGUF_DTYPES = ("gguf", "gguf-q8")  # the inference precisions that compute from GGUF blocks
QUANTISED = ("int8", "int4", *GGUF_DTYPES)  # inference precisions whose weights are not fp
# The vocabulary heads (top-level names) stay int8 under int4 and fp32 under bf16: SmolLM2's (its
# tied token table, 28 M of its 135 M weights) in 4 bits raised its perplexity on IMDb reviews
# by 6.8%, in 8 bits by 0.14% (llama.cpp's 4-bit files keep the output tensor at higher
# precision too); in bf16 its top-1 agreement with fp32 fell from 99.4% to 96.7%.
VOCABULARY_HEADS = ("lm_head", "output_proj")

# PyTorch's CPU kernels for the products: ATen operators, reached through torch.ops, whose
# names start with an underscore (the private-member rule would take them for ours).
INT8_MM = torch.ops.aten._weight_int8pack_mm  # noqa: SLF001
INT4_PACK = torch.ops.aten._convert_weight_to_int4pack_for_cpu  # noqa: SLF001
INT4_MM = torch.ops.aten._weight_int4pack_mm_for_cpu  # noqa: SLF001


class DecodedWeight(nn.Module):
    """A layer standing in for ``nn.Linear`` whose weight is stored in another form: it shows
    that weight decoded (``dequantized()``) as ``weight``, as readers of ``nn.Linear`` expect
    (a head's share of attention's output, a lens's unembedding)."""

    def dequantized(self) -> Tensor:
        raise NotImplementedError

    @property
    def weight(self) -> Tensor:
        return self.dequantized()


class Int8Linear(DecodedWeight):
    """``nn.Linear`` with its weight in int8: w ≈ q · scale, one scale per output row
    (symmetric, q in [-127, 127]). The bias stays in floating point."""

    qweight: Tensor
    scales: Tensor
    bias: Tensor | None

    def __init__(self, qweight: Tensor, scales: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        if qweight.dtype != torch.int8 or qweight.dim() != 2:
            raise ValueError(
                f"qweight must be (N, K) int8, got {qweight.dtype} {tuple(qweight.shape)}"
            )
        self.out_features, self.in_features = qweight.shape
        self.register_buffer("qweight", qweight)  # (N, K) int8
        self.register_buffer("scales", scales)  # (N,), in the activations' dtype
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, dtype: torch.dtype | None = None) -> Int8Linear:
        """Quantise ``linear``'s weight; ``dtype`` is the activations' (default: the weight's)."""
        w = linear.weight.detach().float()  # (N, K)
        scales = w.abs().amax(dim=1).clamp(min=1e-12) / 127  # (N,)
        q = (w / scales[:, None]).round().clamp(-127, 127).to(torch.int8)
        dtype = dtype or linear.weight.dtype
        bias = None if linear.bias is None else linear.bias.detach().to(dtype)
        return cls(q, scales.to(dtype), bias)

    def dequantized(self) -> Tensor:
        """The weight this layer multiplies by, (N, K) in the scales' dtype."""
        return self.qweight.to(self.scales.dtype) * self.scales[:, None]

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_rows(x, 0, self.out_features)

    def forward_rows(self, x: Tensor, start: int, stop: int) -> Tensor:
        """Output features ``start:stop`` only (cross-attention's q, or its k and v)."""
        q, scales = self.qweight[start:stop], self.scales[start:stop]
        bias = None if self.bias is None else self.bias[start:stop]
        # The kernel (torch 2.13) crashes the process on K not a multiple of 16 (24, 40, 72
        # seen): such a layer multiplies by its dequantised weight instead.
        if x.device.type == "cpu" and x.dtype == scales.dtype and self.in_features % 16 == 0:
            flat = x.reshape(-1, self.in_features).contiguous()  # as the kernel reads it
            y = INT8_MM(flat, q, scales)
            y = y.view(*x.shape[:-1], stop - start)
            return y if bias is None else y + bias
        w = q.to(x.dtype) * scales[:, None].to(x.dtype)
        return F.linear(x, w, _cast(bias, x.dtype))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


class BF16Linear(nn.Module):
    """``nn.Linear`` with its weight in bfloat16 and its input and output in the activations'
    dtype (fp32): the product reads half fp32's bytes and runs in bf16 (accumulated in fp32 by
    PyTorch's CPU kernels), while everything between the products (the residual stream, norms,
    softmax, the logits' softmax) stays fp32. Casting the whole model to bf16 instead rounds the
    residual stream at every addition: SmolLM2 then lost its answers (``docs/performance.md``).
    The state-dict keys are ``nn.Linear``'s (``weight``, ``bias``)."""

    weight: Tensor
    bias: Tensor | None

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        if weight.dim() != 2:
            raise ValueError(f"weight must be (N, K), got {tuple(weight.shape)}")
        self.out_features, self.in_features = weight.shape
        self.weight = nn.Parameter(weight.detach().to(torch.bfloat16), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> BF16Linear:
        return cls(linear.weight, linear.bias)

    def dequantized(self) -> Tensor:
        """The weight this layer multiplies by, (N, K) in fp32."""
        return self.weight.float()

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_rows(x, 0, self.out_features)

    def forward_rows(self, x: Tensor, start: int, stop: int) -> Tensor:
        """Output features ``start:stop`` only (cross-attention's q, or its k and v)."""
        w = self.weight[start:stop]  # (stop - start, K): bf16 unless the model was cast since
        y = F.linear(x.to(w.dtype), w).to(x.dtype)
        return y if self.bias is None else y + self.bias[start:stop].to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bf16"


class Int4Linear(DecodedWeight):
    """``nn.Linear`` with its weight in 4 bits: for each group of G input columns of a row,
    w ≈ (q − 8) · scale + zero with q in [0, 15] (asymmetric: the group's minimum and maximum
    are representable). Two 4-bit values share a byte, packed for the CPU kernel."""

    packed: Tensor
    scales_and_zeros: Tensor
    bias: Tensor | None

    def __init__(
        self,
        packed: Tensor,
        scales_and_zeros: Tensor,
        bias: Tensor | None,
        *,
        in_features: int,
        out_features: int,
        group_size: int,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.register_buffer("packed", packed)  # (N, K / 2) uint8, the kernel's layout
        self.register_buffer("scales_and_zeros", scales_and_zeros)  # (K / G, N, 2)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, group_size: int | None = None, dtype: torch.dtype | None = None
    ) -> Int4Linear:
        """Quantise ``linear``'s weight in groups of ``group_size`` input columns (None: 32)."""
        N, K = linear.weight.shape
        group_size = group_size or int4_group_size(K)
        if group_size not in INT4_GROUP_SIZES or K % group_size:
            raise ValueError(
                f"int4 group_size must be one of {INT4_GROUP_SIZES} dividing in_features={K}, "
                f"got {group_size}"
            )
        w = linear.weight.detach().float().view(N, K // group_size, group_size)
        low = w.amin(dim=-1)  # (N, K / G)
        scales = _grid_steps(w, low)
        q = ((w - low[..., None]) / scales[..., None]).round().clamp(0, 15)
        zeros = low + 8 * scales  # the kernel computes (q − 8) · scale + zero
        packed = INT4_PACK(q.view(N, K).to(torch.int32), 1)
        dtype = dtype or linear.weight.dtype
        scales_and_zeros = torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous()
        bias = None if linear.bias is None else linear.bias.detach().to(dtype)
        return cls(
            packed,
            scales_and_zeros.to(dtype),
            bias,
            in_features=K,
            out_features=N,
            group_size=group_size,
        )

    def forward(self, x: Tensor) -> Tensor:
        if x.device.type != "cpu":
            raise RuntimeError(f"int4 weights run on the CPU only; the input is on {x.device}")
        sz = self.scales_and_zeros
        sz = sz if sz.dtype == x.dtype else sz.to(x.dtype)
        flat = x.reshape(-1, self.in_features).contiguous()  # the kernel reads rows densely
        y = INT4_MM(flat, self.packed, self.group_size, sz)
        y = y.view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + _cast(self.bias, y.dtype)

    def forward_rows(self, x: Tensor, start: int, stop: int) -> Tensor:
        """Output features ``start:stop``: all are computed (the packed layout does not
        slice by rows), then cut."""
        return self(x)[..., start:stop]

    def dequantized(self) -> Tensor:
        """The weight this layer multiplies by, (N, K): its product with the identity."""
        eye = torch.eye(self.in_features, dtype=self.scales_and_zeros.dtype)
        sz = self.scales_and_zeros
        w_t = INT4_MM(eye, self.packed, self.group_size, sz)
        return w_t.t()

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"int4, group_size={self.group_size}"
        )


def _grid_steps(w: Tensor, low: Tensor) -> Tensor:
    """The step of each group's 4-bit grid, (N, K / G), for groups ``w`` (N, K / G, G).

    Min/max over 15 steps, unless fewer steps fit the group far better: weights already on a
    4-bit grid (a GGUF Q4_1 block whose values use only some of the 16 levels) then keep that
    grid instead of being rounded onto another one. Finest grid first, so a coarser one is
    taken only where it is at least ten times closer."""
    span = (w.amax(dim=-1) - low).clamp(min=1e-12)
    best = span / 15
    best_error = _grid_error(w, low, best)
    for steps in range(14, 0, -1):
        step = span / steps
        error = _grid_error(w, low, step)
        closer = error < best_error / 10
        best = torch.where(closer, step, best)
        best_error = torch.where(closer, error, best_error)
    return best


def _grid_error(w: Tensor, low: Tensor, step: Tensor) -> Tensor:
    """The largest distance of a group's weights from the grid low + k · step, (N, K / G)."""
    offset = (w - low[..., None]) / step[..., None]
    return ((offset - offset.round()).abs() * step[..., None]).amax(dim=-1)


def int4_group_size(in_features: int) -> int:
    """The int4 group size for K input columns: 32 (GGUF's Q4_0/Q4_1 blocks, so a model read
    from one is re-quantised on its own grid; 64 lost SmolLM2's answers)."""
    if in_features % 32:
        raise ValueError(f"int4 needs in_features divisible by 32, got {in_features}")
    return 32


def _cast(t: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    return None if t is None else t.to(dtype)
