"""Attention and encoder-layer speed, side by side in one process.

Compares glassformer's MultiHeadAttention (fused path, and the readable path that
returns weights) with nn.MultiheadAttention, and glassformer's EncoderLayer with
nn.TransformerEncoderLayer (training step, and inference where nn takes its fast path).
Runs are interleaved and repeated; medians and ratios are printed (> 1 means
glassformer is faster).

    python benchmarks/attention.py [--repeats 7] [--threads N]
"""

from __future__ import annotations

import argparse

import torch
from _common import compare  # benchmarks/_common.py
from torch import nn

from glassformer import EncoderLayer, MultiHeadAttention, causal_mask
from glassformer.interop import from_torch_nn


def attention(B: int, T: int, D: int, H: int, causal: bool, repeats: int) -> None:
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(D, H, batch_first=True)
    ours = MultiHeadAttention(d_model=D, num_heads=H, causal=causal)
    ours.load_state_dict(from_torch_nn(ref.state_dict()))
    x = torch.randn(B, T, D, requires_grad=True)
    nn_mask = ~causal_mask(T) if causal else None

    def step(f):
        def run():
            f().sum().backward()

        return run

    compare(
        f"self-attention fwd+bwd, B={B} T={T} D={D} H={H} causal={causal}",
        {
            "glassformer MultiHeadAttention (fused)": step(lambda: ours(x).output),
            "glassformer, readable path (weights)": step(lambda: ours(x, need_weights=True).output),
            "nn.MultiheadAttention": step(
                lambda: ref(x, x, x, attn_mask=nn_mask, is_causal=causal, need_weights=False)[0]
            ),
        },
        repeats,
        inner=3,
    )


def encoder_layer(B: int, T: int, D: int, H: int, repeats: int) -> None:
    torch.manual_seed(0)
    ref = nn.TransformerEncoderLayer(D, H, 4 * D, dropout=0.1, batch_first=True)
    ours = EncoderLayer(d_model=D, num_heads=H, d_ff=4 * D, dropout=0.1)
    ours.load_state_dict(from_torch_nn(ref.state_dict()))
    x = torch.randn(B, T, D)

    def train(f, m):
        def run():
            m.train()
            f().sum().backward()

        return run

    compare(
        f"encoder layer training step, B={B} T={T} D={D} H={H}",
        {
            "glassformer EncoderLayer": train(lambda: ours(x).hidden, ours),
            "nn.TransformerEncoderLayer": train(lambda: ref(x), ref),
        },
        repeats,
        inner=3,
    )

    ours.eval(), ref.eval()
    with torch.inference_mode():
        compare(
            f"encoder layer inference, B={B} T={T} D={D} H={H}",
            {
                "glassformer EncoderLayer": lambda: ours(x),
                "nn.TransformerEncoderLayer (fast path)": lambda: ref(x),
            },
            repeats,
            inner=5,
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    attention(8, 256, 384, 6, causal=True, repeats=args.repeats)  # the medium GPT's shape
    attention(32, 100, 128, 8, causal=False, repeats=args.repeats)  # Bloem's classifier shape
    encoder_layer(32, 100, 128, 8, repeats=args.repeats)


if __name__ == "__main__":
    main()
