"""GPT training speed: glassformer next to nanoGPT and Hugging Face GPT-2, same shapes.

One training step = forward, cross-entropy, backward, gradient clipping at 1.0, AdamW
step, zeroing the gradients, on random token batches. Two shapes:

    small   4 layers, 4 heads, 128 wide, context 64, batch 12  (nanoGPT's README CPU config)
    medium  6 layers, 6 heads, 384 wide, context 256, batch 8  (shakespeare-char's model)

vocabulary 65, dropout 0. glassformer runs nanoGPT's block (``bias=False``: no biases in the
linear layers and LayerNorms, nanoGPT's train.py default; the same parameter count) and,
for reference, GPT-2's block with biases;
``--compile`` adds glassformer under ``torch.compile`` (compiling is untimed warm-up). nanoGPT's
model.py comes from a checkout passed in by path (nothing of it is copied here); Hugging
Face's from the installed ``transformers``. Contenders run interleaved, several repeats;
the medians give tokens/s, the ratio to nanoGPT fp32, and the model FLOPs utilisation
(6·N + 12·L·T·D FLOPs a token, nanoGPT's estimate) against this run's own measured
matmul peak. glassformer under bf16 autocast runs only where the CPU has native bf16.

    python benchmarks/gpt_train.py --nanogpt ~/src/nanoGPT [--shapes small medium] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from _common import export_checkout, interleaved, matmul_peak, native_bf16

from glassformer import GPT, GPTConfig
from glassformer.training import make_optimizer

SHAPES = {
    "small": dict(layers=4, heads=4, width=128, context=64, batch=12),
    "medium": dict(layers=6, heads=6, width=384, context=256, batch=8),
}
VOCAB = 65


def step_fn(model, optimizer, batches, loss_of, bf16: bool = False):
    """One training step on the next batch, as a closure."""
    it = iter(batches)

    def step():
        x, y = next(it)
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            loss = loss_of(model, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def random_batches(batch: int, context: int):
    g = torch.Generator().manual_seed(0)
    while True:
        data = torch.randint(0, VOCAB, (batch, context + 1), generator=g)
        yield data[:, :-1].contiguous(), data[:, 1:].contiguous()


def glassformer_model(s: dict, bias: bool = False) -> GPT:
    config = GPTConfig(
        vocab_size=VOCAB,
        max_len=s["context"],
        d_model=s["width"],
        num_heads=s["heads"],
        num_layers=s["layers"],
        d_ff=4 * s["width"],
        dropout=0.0,
        pad_id=None,
        bias=bias,
    )
    return GPT(config)


def nanogpt_model(code: Path, s: dict):
    sys.path.insert(0, str(code))
    from model import GPT as NanoGPT  # noqa: N811 -- nanoGPT's own class, from its checkout
    from model import GPTConfig as NanoConfig

    config = NanoConfig(
        block_size=s["context"],
        vocab_size=VOCAB,
        n_layer=s["layers"],
        n_head=s["heads"],
        n_embd=s["width"],
        dropout=0.0,
        bias=False,
    )
    return NanoGPT(config)


def hf_model(s: dict):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=s["context"],
        n_embd=s["width"],
        n_layer=s["layers"],
        n_head=s["heads"],
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=None,
        eos_token_id=None,
    )
    return GPT2LMHeadModel(config)


def contenders(s: dict, nanogpt: Path | None, hf: bool, bf16: bool, compiled: bool = False):
    torch.manual_seed(0)
    steps = {}
    ours = glassformer_model(s)
    steps["glassformer fp32"] = step_fn(
        ours,
        make_optimizer(ours, "adamw", lr=1e-3),
        random_batches(s["batch"], s["context"]),
        lambda m, x, y: m(x, labels=y).loss,
    )
    with_bias = glassformer_model(s, bias=True)
    steps["glassformer fp32, biases"] = step_fn(
        with_bias,
        make_optimizer(with_bias, "adamw", lr=1e-3),
        random_batches(s["batch"], s["context"]),
        lambda m, x, y: m(x, labels=y).loss,
    )
    if compiled:
        plain = glassformer_model(s)
        steps["glassformer fp32 torch.compile"] = step_fn(
            torch.compile(plain),
            make_optimizer(plain, "adamw", lr=1e-3),
            random_batches(s["batch"], s["context"]),
            lambda m, x, y: m(x, labels=y).loss,
        )
    if bf16:
        ours16 = glassformer_model(s)
        steps["glassformer bf16 autocast"] = step_fn(
            ours16,
            make_optimizer(ours16, "adamw", lr=1e-3),
            random_batches(s["batch"], s["context"]),
            lambda m, x, y: m(x, labels=y).loss,
            bf16=True,
        )
    if nanogpt is not None:
        nano = nanogpt_model(nanogpt, s)
        optimizer = nano.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
        steps["nanoGPT fp32"] = step_fn(
            nano,
            optimizer,
            random_batches(s["batch"], s["context"]),
            lambda m, x, y: m(x, y)[1],
        )
    if hf:
        model = hf_model(s)
        steps["Hugging Face GPT-2 fp32"] = step_fn(
            model,
            torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95)),
            random_batches(s["batch"], s["context"]),
            lambda m, x, y: F.cross_entropy(m(x).logits.reshape(-1, VOCAB), y.reshape(-1)),
        )
    return steps, ours


def flops_per_token(model: GPT, s: dict) -> float:
    n = sum(p.numel() for p in model.parameters()) - sum(
        p.numel() for p in model.pos_embed.parameters()
    )
    return 6 * n + 12 * s["layers"] * s["context"] * s["width"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nanogpt", type=Path, help="nanoGPT checkout (or bare mirror)")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="steps per timing")
    parser.add_argument("--no-hf", action="store_true", help="leave Hugging Face out")
    parser.add_argument(
        "--compile", action="store_true", help="add glassformer under torch.compile (slow start)"
    )
    args = parser.parse_args()
    try:
        import transformers  # noqa: F401
    except ImportError:
        args.no_hf = True
    bf16 = native_bf16()
    code = None
    with tempfile.TemporaryDirectory() as tmp:
        if args.nanogpt is not None:
            code = export_checkout(args.nanogpt.expanduser(), Path(tmp) / "nanogpt")
        peak = {"fp32": matmul_peak(torch.float32)}
        if bf16:
            peak["bf16"] = matmul_peak(torch.bfloat16)
        print(
            f"{torch.get_num_threads()} threads; matmul peak in this run: "
            + ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in peak.items())
            + ("" if bf16 else "; bf16 left out: this CPU emulates it")
        )
        for name in args.shapes:
            s = SHAPES[name]
            steps, ours = contenders(s, code, not args.no_hf, bf16, args.compile)
            medians = interleaved(steps, args.repeats, args.steps, warmup=3)
            tokens = s["batch"] * s["context"]
            per_token = flops_per_token(ours, s)
            base = medians.get("nanoGPT fp32")
            print(
                f"\n{name}: {s['layers']} layers, {s['heads']} heads, {s['width']} wide, "
                f"context {s['context']}, batch {s['batch']}"
            )
            for who, seconds in medians.items():
                rate = tokens / seconds
                mfu = rate * per_token / peak["bf16" if "bf16" in who else "fp32"]
                ratio = f"{base / seconds:5.2f}x nanoGPT" if base else ""
                print(
                    f"  {who:<28} {seconds * 1e3:8.1f} ms/step {rate:9,.0f} tokens/s "
                    f"MFU {mfu:5.1%}  {ratio}"
                )


if __name__ == "__main__":
    main()
