"""The modern decoder block against GPT-2's, trained from scratch on austen for the same minutes.

GPT-2's block (learned positions, LayerNorm with biases, GELU MLP 4x wide, one key/value
head per query head) against the Llama/SmolLM2 block (rotary positions, RMSNorm, SwiGLU,
grouped-query attention with 2 key/value heads for 4 query heads, no biases), both 4 layers
of width 128, the modern one's feed-forward width chosen so that the two parameter counts
are equal to within 1%. Everything else is the same: characters of Jane Austen, 128-token
windows, batch 32, AdamW at 2e-3 with 100 warm-up steps and a cosine over the minutes,
seed 1337.

The two runs train at the same time, each in its own process on one thread, so that both
get the same share of a machine (run it on an otherwise idle one). Each prints its steps,
and the held-out losses of its run directory's results.json (every validation and test
window) are compared.

    python benchmarks/modern_block.py [--minutes 5] [--out runs/modern-block]
    glassformer bench modern-block
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from glassformer import GPT, GPTConfig

COMMON = ["--corpus", "austen", "--block-size", "128", "--batch-size", "32", "--threads", "1"]
GPT2 = dict(preset="tiny")
MODERN = dict(preset="llama-tiny")


def parameters(preset: str, d_ff: int | None = None, vocab: int = 100) -> int:
    overrides = {"max_len": 128, "vocab_size": vocab}
    if d_ff is not None:
        overrides["d_ff"] = d_ff
    return GPT(GPTConfig.preset(preset, **overrides)).num_parameters()


def matching_d_ff(target: int) -> int:
    """The modern block's feed-forward width (a multiple of 8) nearest ``target`` parameters."""
    return min(range(8, 2048, 8), key=lambda d: abs(parameters("llama-tiny", d) - target))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--out", default="runs/modern-block")
    args = parser.parse_args()
    gpt2_params = parameters("tiny")
    d_ff = matching_d_ff(gpt2_params)
    modern_params = parameters("llama-tiny", d_ff)
    print(
        f"GPT-2 block: {gpt2_params:,} parameters; modern block (d_ff {d_ff}): "
        f"{modern_params:,} ({modern_params / gpt2_params - 1:+.2%}); counted with a "
        "100-character vocabulary"
    )
    out = Path(args.out)
    runs = {
        "GPT-2 block": (out / "gpt2", ["--preset", "tiny"]),
        "modern block": (out / "modern", ["--preset", "llama-tiny", "--d-ff", str(d_ff)]),
    }
    procs = {}
    for name, (run, flags) in runs.items():
        command = [
            sys.executable, "-m", "glassformer", "train", "lm", *COMMON, *flags,
            "--minutes", str(args.minutes), "--out", str(run),
        ]  # fmt: skip
        procs[name] = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    failed = False
    for name, proc in procs.items():
        output, _ = proc.communicate()
        if proc.returncode != 0:
            print(f"{name} failed:\n{output.decode()[-2000:]}")
            failed = True
    if failed:
        raise SystemExit(1)
    print(f"\n{args.minutes:g} minutes each, at the same time, one thread each:")
    for name, (run, _) in runs.items():
        results = json.loads((run / "results.json").read_text())
        model = GPT.from_pretrained(run / "checkpoint")
        print(
            f"  {name:<13} {model.num_parameters():>9,} parameters  {results['step']:>5} steps  "
            f"val loss {results['val_loss_full']:.4f}  test loss {results['test_loss']:.4f}"
        )


if __name__ == "__main__":
    main()
