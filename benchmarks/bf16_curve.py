"""Does bf16 autocast train as well as fp32? Loss curves side by side, and the time they took.

The medium GPT (6 layers, 6 heads, 384 wide, context 256, batch 8, dropout 0) learns the
character-level ``austen`` corpus three times, each for the same number of steps with
AdamW, warm-up and cosine decay:

    fp32 seed 0     the reference
    bf16 seed 0     the same initial weights and the same batches, under bf16 autocast
    fp32 seed 1     other initial weights and other batches: what "noise" between runs is

Every ``--eval-every`` steps each run is scored on the same validation windows (in its
own precision). bf16 matches fp32 "within noise" when its distance from the reference
stays within the distance between the two fp32 seeds. Prints the curves, the largest
distances, the seconds per step, and writes a PNG of the curves.

    python benchmarks/bf16_curve.py --steps 300 --out bf16_curve.png
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from _common import native_bf16

from glassformer import GPT, GPTConfig
from glassformer.data import eval_batches, load_corpus
from glassformer.data.batching import LMBatches
from glassformer.training import make_optimizer
from glassformer.training.schedules import Schedule

CONTEXT, BATCH = 256, 8


def encode(splits) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Character ids of the train and validation text, with one shared vocabulary."""
    chars = sorted(set(splits.train) | set(splits.validation))
    index = {c: i for i, c in enumerate(chars)}

    def ids(text: str) -> torch.Tensor:
        return torch.tensor([index[c] for c in text], dtype=torch.int16)

    return ids(splits.train), ids(splits.validation), len(chars)


@torch.no_grad()
def val_loss(model: GPT, windows: list, bf16: bool) -> float:
    model.eval()
    total = 0.0
    for x, y in windows:
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            total += model(x, labels=y).loss.float().item()
    model.train()
    return total / len(windows)


def train(seed: int, bf16: bool, data, vocab: int, args) -> dict:
    """One run: the validation curve, the training loss per interval, seconds per step."""
    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=vocab, max_len=CONTEXT, d_model=384, num_heads=6, num_layers=6,
        dropout=0.0, pad_id=None,
    )  # fmt: skip
    model = GPT(config)
    optimizer = make_optimizer(model, "adamw", lr=args.lr)
    schedule = Schedule("cosine", lr=args.lr, warmup=args.steps // 10, total_steps=args.steps)
    batches = LMBatches(data["train"], CONTEXT, BATCH, seed=seed)
    curve, train_losses, seconds = [], [], 0.0
    running = []
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = schedule.lr_at(step)
        x, y = next(batches)
        start = time.perf_counter()
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            loss = model(x, labels=y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds += time.perf_counter() - start
        running.append(loss.item())
        if (step + 1) % args.eval_every == 0:
            curve.append((step + 1, val_loss(model, data["val"], bf16)))
            train_losses.append(sum(running) / len(running))
            running = []
            print(f"    step {step + 1:4d}  train {train_losses[-1]:.4f}  val {curve[-1][1]:.4f}")
    return {"curve": curve, "train": train_losses, "s_per_step": seconds / args.steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--eval-batches", type=int, default=8, help="validation batches of 8")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out", type=Path, default=Path("bf16_curve.png"))
    args = parser.parse_args()
    if not native_bf16():
        parser.error("this CPU emulates bfloat16: the comparison needs AVX512-BF16 or AMX")
    splits = load_corpus("austen", "lm")
    train_ids, val_ids, vocab = encode(splits)
    windows = list(eval_batches(val_ids, CONTEXT, BATCH, max_batches=args.eval_batches))
    data = {"train": train_ids, "val": windows}
    runs = {}
    for name, seed, bf16 in (("fp32 seed 0", 0, False), ("bf16 seed 0", 0, True),
                             ("fp32 seed 1", 1, False)):  # fmt: skip
        print(f"  {name}")
        runs[name] = train(seed, bf16, data, vocab, args)

    ref, b16, other = (runs[k]["curve"] for k in ("fp32 seed 0", "bf16 seed 0", "fp32 seed 1"))
    gap_bf16 = [abs(a[1] - b[1]) for a, b in zip(ref, b16, strict=True)]
    gap_seed = [abs(a[1] - b[1]) for a, b in zip(ref, other, strict=True)]
    print(f"\n{'step':>5} " + " ".join(f"{k:>12}" for k in runs))
    for i, (step, _) in enumerate(ref):
        print(f"{step:5d} " + " ".join(f"{runs[k]['curve'][i][1]:12.4f}" for k in runs))
    half = len(ref) // 2  # the second half, past the steep start
    print(
        f"\nvalidation loss, |bf16 - fp32| (same seed): max {max(gap_bf16):.4f}, "
        f"mean over the second half {sum(gap_bf16[half:]) / (len(ref) - half):.4f}"
        f"\nvalidation loss, |fp32 seed 1 - fp32 seed 0| (noise): max {max(gap_seed):.4f}, "
        f"mean over the second half {sum(gap_seed[half:]) / (len(ref) - half):.4f}"
    )
    for k, r in runs.items():
        print(f"{k}: {r['s_per_step'] * 1e3:.0f} ms/step, {BATCH * CONTEXT / r['s_per_step']:,.0f} "
              f"tokens/s, final validation loss {r['curve'][-1][1]:.4f}")  # fmt: skip
    speed = runs["fp32 seed 0"]["s_per_step"] / runs["bf16 seed 0"]["s_per_step"]
    print(f"bf16 autocast steps {speed:.2f}x as fast as fp32")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for k, style in zip(runs, ("-", "--", ":"), strict=True):
        steps, losses = zip(*runs[k]["curve"], strict=True)
        ax.plot(steps, losses, style, label=k, linewidth=1.6)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("validation loss (nats per character)")
    ax.set_title("Medium GPT on austen: bf16 autocast against fp32")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"curves: {args.out}")


if __name__ == "__main__":
    main()
