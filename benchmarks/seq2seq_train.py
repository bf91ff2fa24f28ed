"""Encoder-decoder training speed: glassformer's Seq2SeqTransformer next to the same model
built on ``nn.Transformer``, same shapes, same weights' sizes.

The torch.nn side is what the PyTorch tutorials build: source and target ``nn.Embedding``
scaled by √d, sinusoidal positions, ``nn.Transformer(batch_first=True)`` with a causal
target mask, a Linear to the vocabulary. One training step = forward, cross-entropy,
backward, Adam step, zeroing the gradients; dropout 0 on both sides. Shapes:

    base   d 512, 8 heads, 6 + 6 layers, d_ff 2048 (the paper's base model)
    small  d 256, 4 heads, 3 + 3 layers, d_ff 1024

batch 16, 32 source + 32 target tokens, vocabulary 8,000. Interleaved, several repeats;
medians, target tokens/s and the ratio to nn.Transformer are printed.

    python benchmarks/seq2seq_train.py [--shapes base small] [--repeats 5]
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from _common import interleaved
from torch import nn

from glassformer import Seq2SeqConfig, Seq2SeqTransformer

SHAPES = {
    "base": dict(d=512, heads=8, layers=6, d_ff=2048),
    "small": dict(d=256, heads=4, layers=3, d_ff=1024),
}
VOCAB, BATCH, SRC, TGT = 8000, 16, 32, 32


class TorchSeq2Seq(nn.Module):
    """The tutorial model around ``nn.Transformer``."""

    def __init__(self, d: int, heads: int, layers: int, d_ff: int) -> None:
        super().__init__()
        self.d = d
        self.src_embed = nn.Embedding(VOCAB, d)
        self.tgt_embed = nn.Embedding(VOCAB, d)
        position = torch.arange(512)[:, None]
        freq = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
        pe = torch.zeros(512, d)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(position * freq), torch.cos(position * freq)
        self.register_buffer("pe", pe)
        self.transformer = nn.Transformer(
            d, heads, layers, layers, d_ff, dropout=0.0, batch_first=True
        )
        self.out = nn.Linear(d, VOCAB)

    def forward(self, src, tgt):
        s = self.src_embed(src) * math.sqrt(self.d) + self.pe[: src.size(1)]
        t = self.tgt_embed(tgt) * math.sqrt(self.d) + self.pe[: tgt.size(1)]
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.size(1))
        return self.out(self.transformer(s, t, tgt_mask=causal, tgt_is_causal=True))


def batches():
    g = torch.Generator().manual_seed(0)
    while True:
        src = torch.randint(3, VOCAB, (BATCH, SRC), generator=g)
        tgt = torch.randint(3, VOCAB, (BATCH, TGT + 1), generator=g)
        yield src, tgt[:, :-1], tgt[:, 1:]


def step_fn(model, logits_of):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    it = batches()

    def step():
        src, tgt_in, labels = next(it)
        logits = logits_of(model, src, tgt_in)
        F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="steps per timing")
    args = parser.parse_args()
    print(f"{torch.get_num_threads()} threads; batch {BATCH}, {SRC} + {TGT} tokens")
    for name in args.shapes:
        s = SHAPES[name]
        torch.manual_seed(0)
        config = Seq2SeqConfig(
            src_vocab_size=VOCAB,
            tgt_vocab_size=VOCAB,
            d_model=s["d"],
            num_heads=s["heads"],
            num_encoder_layers=s["layers"],
            num_decoder_layers=s["layers"],
            d_ff=s["d_ff"],
            dropout=0.0,
        )
        steps = {
            "glassformer Seq2SeqTransformer": step_fn(
                Seq2SeqTransformer(config), lambda m, src, tgt: m(src, tgt).logits
            ),
            "nn.Transformer (tutorial model)": step_fn(
                TorchSeq2Seq(s["d"], s["heads"], s["layers"], s["d_ff"]),
                lambda m, src, tgt: m(src, tgt),
            ),
        }
        medians = interleaved(steps, args.repeats, args.steps, warmup=2)
        base = medians["nn.Transformer (tutorial model)"]
        print(
            f"\n{name}: d {s['d']}, {s['heads']} heads, {s['layers']} + {s['layers']} "
            f"layers, d_ff {s['d_ff']}"
        )
        for who, seconds in medians.items():
            print(
                f"  {who:<34} {seconds * 1e3:8.1f} ms/step {BATCH * TGT / seconds:8,.0f} "
                f"target tokens/s  {base / seconds:5.2f}x nn.Transformer"
            )


if __name__ == "__main__":
    main()
