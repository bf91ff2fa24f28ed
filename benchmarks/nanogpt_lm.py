"""Character-level language modelling: glassformer against nanoGPT, same data, same minutes.

Both train on the same split of a bundled corpus with the same character vocabulary for
the same wall-clock budget; both final models are then scored on the same validation
windows (every non-overlapping window of the validation split, context --block-size).

nanoGPT runs from its own checkout (passed in by path; nothing of it is copied into
glassformer) at its README's CPU configuration: 4 layers, 4 heads, 128 wide, context
64, batch 12, dropout 0, lr 1e-3 decayed over the run. Its iteration count is set so its
training fills the budget (measured from a short calibration run first).

With ``--device cuda`` both run nanoGPT's own GPU configuration (its
config/train_shakespeare_char.py: 6 layers, 6 heads, 384 wide, context 256, batch 64,
dropout 0.2, lr 1e-3, bf16 autocast, compiled), and glassformer the same shape with
``--bf16 on --compile``; both models are scored on the GPU in fp32.

    python benchmarks/nanogpt_lm.py --nanogpt ~/src/nanoGPT --corpus austen --minutes 5
    python benchmarks/nanogpt_lm.py --nanogpt ~/src/nanoGPT --device cuda --minutes 2
"""

from __future__ import annotations

import argparse
import json
import pickle
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import export_checkout  # benchmarks/_common.py

from glassformer import load_checkpoint
from glassformer.data import eval_batches, load_corpus, train_tokenizer

NANOGPT_CPU = [
    "--device=cpu",
    "--compile=False",
    "--eval_iters=20",
    "--block_size=64",
    "--batch_size=12",
    "--n_layer=4",
    "--n_head=4",
    "--n_embd=128",
    "--dropout=0.0",
]
# nanoGPT's GPU run is its shakespeare_char config as written (bf16 autocast, compiled).
NANOGPT_CUDA = ["--device=cuda", "--compile=True", "--eval_iters=20"]
OURS_CUDA = (
    "--d-model 384 --num-heads 6 --num-layers 6 --d-ff 1536 --batch-size 64 --lr 1e-3 "
    "--dropout 0.2 --device cuda --bf16 on --compile"
)


def run_nanogpt(code: Path, iters: int, out: Path, device: str) -> tuple[float, float]:
    """Train nanoGPT for ``iters`` iterations; return (wall seconds, mean ms per iteration)."""
    cmd = [
        sys.executable,
        "train.py",
        "config/train_shakespeare_char.py",
        "--dataset=bench",
        *(NANOGPT_CUDA if device == "cuda" else NANOGPT_CPU),
        f"--max_iters={iters}",
        f"--lr_decay_iters={iters}",
        f"--eval_interval={iters}",
        "--log_interval=10",
        "--always_save_checkpoint=True",
        f"--out_dir={out}",
    ]
    start = time.perf_counter()
    result = subprocess.run(cmd, cwd=code, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"nanoGPT failed:\n{result.stderr[-2000:]}")
    times = [float(m) for m in re.findall(r"iter \d+: loss [\d.]+, time ([\d.]+)ms", result.stdout)]
    return seconds, float(np.median(times[2:])) if len(times) > 3 else float("nan")


def nanogpt_loss(code: Path, ckpt: Path, windows, device: str) -> float:
    sys.path.insert(0, str(code))
    from model import GPT as NanoGPT  # noqa: N811 -- nanoGPT's own class, from its checkout
    from model import GPTConfig as NanoConfig

    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    model = NanoGPT(NanoConfig(**state["model_args"]))
    model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in state["model"].items()})
    model.to(device).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in windows:
            x, y = x.to(device), y.to(device)
            _, loss = model(x, y)
            total += loss.item() * y.numel()
            count += y.numel()
    return total / count


def glassformer_loss(run: Path, windows, device: str) -> float:
    model = load_checkpoint(run).to(device)
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in windows:
            x, y = x.to(device), y.to(device)
            logits = model(x).logits
            total += torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), y.flatten(), reduction="sum"
            ).item()
            count += y.numel()
    return total / count


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nanogpt", required=True, type=Path, help="nanoGPT checkout (or bare mirror)")
    p.add_argument("--corpus", default="austen", choices=["austen", "imdb"])
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--block-size", type=int, help="context (default: 64 on cpu, 256 on cuda)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument(
        "--ours",
        help="glassformer train lm options besides corpus, budget, block size (default on "
        "cpu: --preset tiny --batch-size 32 --lr 2e-3 --dropout 0.0; on cuda: " + OURS_CUDA + ")",
    )
    p.add_argument("--work", type=Path, default=None, help="keep runs here (default: a temp dir)")
    args = p.parse_args()
    cuda = args.device == "cuda"
    args.block_size = args.block_size or (256 if cuda else 64)
    default = OURS_CUDA if cuda else "--preset tiny --batch-size 32 --lr 2e-3 --dropout 0.0"
    args.ours = args.ours or default
    if cuda:
        print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="nanogpt-bench-"))
    work.mkdir(parents=True, exist_ok=True)

    splits = load_corpus(args.corpus, "lm")
    tok = train_tokenizer("char", [splits.train])
    train_ids = np.array(tok.encode(splits.train), dtype=np.uint16)
    val_ids = np.array(tok.encode(splits.validation), dtype=np.uint16)
    code = export_checkout(args.nanogpt.expanduser(), work / "nanogpt")
    data = code / "data" / "bench"
    data.mkdir(parents=True)
    train_ids.tofile(data / "train.bin")
    val_ids.tofile(data / "val.bin")
    with open(data / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": tok.vocab_size}, f)
    windows = list(eval_batches(torch.from_numpy(val_ids.astype(np.int64)), args.block_size, 64))
    print(
        f"{splits.description}; vocabulary {tok.vocab_size}; "
        f"{sum(y.numel() for _, y in windows):,} validation tokens scored",
        flush=True,
    )

    # nanoGPT: calibrate its speed, then train for as many iterations as the budget holds.
    _, ms = run_nanogpt(code, 200, work / "nanogpt-calibrate", args.device)
    iters = int(args.minutes * 60_000 / ms)
    print(f"nanoGPT: {ms:.1f} ms/iteration -> {iters} iterations in {args.minutes} min", flush=True)
    seconds, ms = run_nanogpt(code, iters, work / "nanogpt-run", args.device)
    nano = nanogpt_loss(code, work / "nanogpt-run" / "ckpt.pt", windows, args.device)
    print(f"nanoGPT: {seconds / 60:.2f} min wall, validation loss {nano:.4f}", flush=True)

    # glassformer: the same budget of training time.
    run = work / "glassformer-run"
    cmd = [
        sys.executable,
        "-m",
        "glassformer",
        "train",
        "lm",
        "--corpus",
        args.corpus,
        "--minutes",
        str(args.minutes),
        "--block-size",
        str(args.block_size),
        "--out",
        str(run),
        "--eval-every",
        "0",
        "--no-test",
        *args.ours.split(),
    ]
    start = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"glassformer failed:\n{result.stderr[-2000:]}")
    wall = time.perf_counter() - start
    ours = glassformer_loss(run, windows, args.device)
    steps = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"]
    print(
        f"glassformer: {steps} steps, {wall / 60:.2f} min wall (incl. data prep), "
        f"validation loss {ours:.4f}"
    )
    print(
        f"\nvalidation loss after {args.minutes} min: glassformer {ours:.4f}, nanoGPT {nano:.4f} "
        f"({'lower' if ours < nano else 'higher'} by {abs(nano - ours):.4f})"
    )
    (work / "result.json").write_text(
        json.dumps(
            {
                "corpus": args.corpus,
                "minutes": args.minutes,
                "glassformer_val_loss": ours,
                "nanogpt_val_loss": nano,
                "nanogpt_iters": iters,
                "glassformer_steps": steps,
                "ours": args.ours,
                "device": torch.cuda.get_device_name() if cuda else "cpu",
                "nanogpt_ms_per_iter": ms,
            },
            indent=2,
        )
    )
    print(f"runs kept in {work}")


if __name__ == "__main__":
    main()
