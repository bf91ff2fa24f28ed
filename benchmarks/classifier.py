"""Encoder-classifier speed: glassformer's TransformerClassifier next to the same model on
``nn.TransformerEncoder``, training and inference (where nn takes its fast path).

Bloem's classifier size: d 128, 8 heads, 6 layers, d_ff 512, 100 tokens, batch 32,
vocabulary 16,000, learned positions, mean pooling over real tokens, 2 classes, dropout
0. The nn side: embeddings + positions, ``nn.TransformerEncoder`` (batch_first, nested
tensors on, so inference under ``torch.inference_mode`` takes its fused fast path),
masked mean, Linear. Two batches: every review 100 tokens, and padded reviews of 40 to
100 tokens (the fast path then skips the pads as nested tensors). Interleaved, several
repeats; medians, positions/s and the ratio to nn are printed.

    python benchmarks/classifier.py [--repeats 5]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from _common import interleaved
from torch import nn

from glassformer import ClassifierConfig, TransformerClassifier

D, HEADS, LAYERS, D_FF, T, BATCH, VOCAB = 128, 8, 6, 512, 100, 32, 16000


class TorchClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.token = nn.Embedding(VOCAB, D)
        self.position = nn.Embedding(T, D)
        layer = nn.TransformerEncoderLayer(D, HEADS, D_FF, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=True)
        self.head = nn.Linear(D, 2)

    def forward(self, ids):
        pad = ids == 0  # True = padding, nn's polarity
        x = self.token(ids) + self.position(torch.arange(ids.size(1)))
        x = self.encoder(x, src_key_padding_mask=pad if pad.any() else None)
        real = (~pad).unsqueeze(-1).to(x.dtype)
        return self.head((x.nan_to_num(0.0) * real).sum(1) / real.sum(1))


def make_batch(padded: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (BATCH, T), generator=g)
    if padded:
        lengths = torch.randint(40, T + 1, (BATCH,), generator=g)
        lengths[0] = T
        ids[torch.arange(T) >= lengths[:, None]] = 0
    return ids


def train_step(model, logits_of, ids):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    labels = torch.randint(0, 2, (BATCH,))
    model.train()

    def step():
        F.cross_entropy(logits_of(model, ids), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def infer(model, logits_of, ids):
    def run():
        model.eval()
        with torch.inference_mode():
            logits_of(model, ids)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = ClassifierConfig(
        vocab_size=VOCAB,
        num_classes=2,
        max_len=T,
        d_model=D,
        num_heads=HEADS,
        num_layers=LAYERS,
        d_ff=D_FF,
        dropout=0.0,
        pad_id=0,
    )
    ours, theirs = TransformerClassifier(config), TorchClassifier()
    contenders = {
        "glassformer TransformerClassifier": (ours, lambda m, ids: m(ids).logits),
        "nn.TransformerEncoder": (theirs, lambda m, ids: m(ids)),
    }
    print(
        f"{torch.get_num_threads()} threads; d {D}, {HEADS} heads, {LAYERS} layers, "
        f"{T} tokens, batch {BATCH}"
    )
    for padded in (False, True):
        ids = make_batch(padded)
        real = int((ids != 0).sum())
        for what, make, inner in (("training step", train_step, 3), ("inference", infer, 10)):
            fns = {name: make(m, f, ids) for name, (m, f) in contenders.items()}
            medians = interleaved(fns, args.repeats, inner, warmup=2)
            base = medians["nn.TransformerEncoder"]
            label = "padded to 40-100 tokens" if padded else "all 100 tokens"
            print(f"\n{what}, {label} ({real:,} real positions)")
            for who, seconds in medians.items():
                print(
                    f"  {who:<34} {seconds * 1e3:8.2f} ms {real / seconds:9,.0f} positions/s "
                    f"{base / seconds:5.2f}x nn"
                )


if __name__ == "__main__":
    main()
