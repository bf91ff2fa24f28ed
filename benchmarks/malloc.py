"""What keeping freed memory (``glassformer.training.memory``) is worth: GPT training steps in
two kinds of process, one with glibc's default malloc and one as `glassformer train` runs.

The setting is process-wide, so the two cannot share one process: each timing runs in a
fresh subprocess, the two kinds alternating, several repeats; medians of the steady-state
seconds per step and of the page faults per step.

    python benchmarks/malloc.py [--shape medium] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

CHILD = "--child"


def child(shape: str, keep: bool, steps: int) -> None:
    import torch
    from gpt_train import SHAPES, glassformer_model, random_batches, step_fn

    from glassformer.training import make_optimizer
    from glassformer.training.memory import keep_freed_memory

    if keep:
        keep_freed_memory()
    torch.manual_seed(0)
    s = SHAPES[shape]
    model = glassformer_model(s)
    step = step_fn(
        model,
        make_optimizer(model, "adamw", lr=1e-3),
        random_batches(s["batch"], s["context"]),
        lambda m, x, y: m(x, labels=y).loss,
    )
    for _ in range(2):
        step()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    for _ in range(steps):
        step()
    seconds = (time.perf_counter() - start) / steps
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps
    print(json.dumps({"s_per_step": seconds, "faults_per_step": faults}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=["small", "medium"], default="medium")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per process")
    parser.add_argument(CHILD, choices=["default", "keep"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.shape, args.child == "keep", args.steps)
        return
    results: dict[str, list[dict]] = {"default": [], "keep": []}
    for _ in range(args.repeats):
        for kind in results:
            command = [sys.executable, __file__, CHILD, kind, "--shape", args.shape]
            out = subprocess.run(
                [*command, "--steps", str(args.steps)], capture_output=True, text=True, check=True
            )
            results[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
    medians = {
        kind: {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        for kind, rows in results.items()
    }
    print(f"GPT {args.shape}, {args.repeats} processes of each kind, {args.steps} steps each")
    for kind, m in medians.items():
        label = "glibc default" if kind == "default" else "keep freed memory"
        print(
            f"  {label:<18} {m['s_per_step'] * 1e3:8.1f} ms/step "
            f"{m['faults_per_step']:9,.0f} page faults/step"
        )
    speed = medians["default"]["s_per_step"] / medians["keep"]["s_per_step"]
    print(f"  keeping freed memory: {speed:.3f}x the steps per second")


if __name__ == "__main__":
    main()
