"""ggml's tensor encodings decoded to fp32: kept under this name for the GGUF reader; the
decoders live with the layers that compute from the blocks (``glassformer.kernels.gguf_blocks``)."""

from glassformer.kernels.gguf_blocks import (
    BF16,
    BLOCK,
    BLOCK_BYTES,
    BLOCK_VALUES,
    F16,
    F32,
    NAMES,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_K,
    Q6_K,
    Q8_0,
    SUPER,
    dequantize,
)

__all__ = [
    "BF16",
    "BLOCK",
    "BLOCK_BYTES",
    "BLOCK_VALUES",
    "F16",
    "F32",
    "NAMES",
    "Q4_0",
    "Q4_1",
    "Q4_K",
    "Q5_0",
    "Q5_1",
    "Q5_K",
    "Q6_K",
    "Q8_0",
    "SUPER",
    "dequantize",
]
