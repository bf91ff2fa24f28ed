"""Hook points and the activation cache, side by side with TransformerLens, on a GPT-2-small shape.

A random GPT-2 small (12 layers, 768 wide, 12 heads, vocabulary 50,257) saved by transformers is
read by glassformer (``GPT.from_pretrained``) and by TransformerLens 4 (``TransformerBridge``,
nothing folded); a batch of 4 × 128 tokens. In one process, interleaved, ``--repeats`` times,
the median of:

- a plain forward (glassformer's, whose hook points are unused, and TransformerLens's);
- ``run_with_cache`` of everything (glassformer leaves out the per-head results, which
  TransformerLens does not compute either), and of the attention patterns only;

with the bytes each cache holds. With ``--before DIR`` (a source checkout from before the hook
points, e.g. ``git worktree add /tmp/before fd4cde2``) it also times glassformer's forward
there and here, in alternating fresh processes, for the cost of unused hook points.

    python benchmarks/hooks.py [--repeats 5] [--before /tmp/before]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

CHILD = r"""
import statistics, sys, time, torch
sys.path.insert(0, sys.argv[1])
from glassformer import GPT
model = GPT.from_pretrained(sys.argv[2]).eval()
ids = torch.randint(0, 50257, (4, 128), generator=torch.Generator().manual_seed(0))
with torch.inference_mode():
    model(ids)
    times = []
    for _ in range(int(sys.argv[3])):
        start = time.perf_counter(); model(ids); times.append(time.perf_counter() - start)
print(statistics.median(times))
"""


def nbytes(cache) -> int:
    return sum(v.numel() * v.element_size() for v in cache.values())


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--before", help="a source checkout from before the hook points")
    args = parser.parse_args()
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    from glassformer import GPT

    folder = Path(tempfile.mkdtemp(prefix="gpt2-small-"))
    torch.manual_seed(0)
    config = transformers.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    ours = GPT.from_pretrained(folder).eval()
    theirs = TransformerBridge.boot_transformers(str(folder), device="cpu")
    ids = torch.randint(0, 50257, (4, 128), generator=torch.Generator().manual_seed(0))
    contenders = {
        "forward": (lambda: ours(ids), lambda: theirs(ids)),
        "run_with_cache, everything": (
            lambda: ours.run_with_cache(ids),
            lambda: theirs.run_with_cache(ids),
        ),
        "run_with_cache, patterns only": (
            lambda: ours.run_with_cache(ids, names="*.hook_pattern"),
            lambda: theirs.run_with_cache(ids, names_filter=lambda n: n.endswith("hook_pattern")),
        ),
    }
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; random GPT-2 small, "
        f"batch 4 × 128 tokens, median of {args.repeats}"
    )
    sizes = {}
    with torch.inference_mode():
        for name, (mine, yours) in contenders.items():
            for fn in (mine, yours):
                fn()  # warm-up
            t_ours, t_theirs = [], []
            for _ in range(args.repeats):  # interleaved
                t_ours.append(median_time(mine, 1))
                t_theirs.append(median_time(yours, 1))
            a, b = statistics.median(t_ours), statistics.median(t_theirs)
            line = f"  {name:<32} glassformer {a:6.3f} s  TransformerLens {b:6.3f} s  {b / a:5.2f}x"
            if name != "forward":
                mine_bytes, their_bytes = nbytes(mine()[1]), nbytes(yours()[1])
                sizes[name] = mine_bytes
                line += f"   cache {mine_bytes / 2**20:7.1f} MiB vs {their_bytes / 2**20:7.1f} MiB"
            print(line)
    everything, patterns = (
        sizes["run_with_cache, everything"],
        sizes["run_with_cache, patterns only"],
    )
    print(f"  the patterns-only cache is {everything / patterns:.1f}x smaller than everything")
    if args.before:
        here = str(Path(__file__).resolve().parents[1] / "src")
        before = str(Path(args.before) / "src")
        runs: dict[str, list[float]] = {"before": [], "now": []}
        for _ in range(args.repeats):
            for label, src in (("before", before), ("now", here)):
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, src, str(folder), "5"],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                runs[label].append(float(out.stdout.strip().splitlines()[-1]))
        a, b = statistics.median(runs["before"]), statistics.median(runs["now"])
        print(
            f"  glassformer forward before the hook points {a:.3f} s, with them unused "
            f"{b:.3f} s: {a / b:.3f}x"
        )


if __name__ == "__main__":
    main()
