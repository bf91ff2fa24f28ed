"""What attention costs as the sequence grows: time and peak memory against length.

One attention layer (MultiHeadAttention, D=256, 4 heads) and a whole model (a two-layer
TransformerClassifier, D=256, 4 heads, d_ff 1024), batch 1, lengths 128 to 16,384, three ways:

  readable  the spelled-out matmul-softmax-matmul (need_weights=True): it materialises the
            (B, H, T, T) scores and weights
  fused     F.scaled_dot_product_attention (PyTorch's flash-style kernel), dense
  local     local attention (attention_window=W: each token attends the W before and the W
            after it, 2W + 1 keys), computed in chunks

For each: the forward's time (no gradients), forward + backward's time, and the memory one
forward + backward adds, and the exponent k of a straight line fitted to log(cost) against
log(length) over the lengths from 1,024 up (cost ∝ Tᵏ: 2 is quadratic, 1 linear; below 1,024
the fixed per-call costs hide the trend).

Time: the three ways run interleaved in this process, several repeats, medians. Memory: every
point runs once in a fresh process that builds the layer or model and its input, warms up on
128 tokens, resets the kernel's peak-resident-set counter (/proc/self/clear_refs), runs one
forward + backward and reports its peak resident set (VmHWM) minus its resident set just before:
all the step allocated, the kernels' own buffers and the parameters' gradients included, the
input excluded. A fresh process each time, because glibc keeps freed blocks for reuse, so in one
process a later point could reuse an earlier one's pages unseen.

The readable path is skipped where its (T, T) tensors would pass --memory-limit (they are
estimated as 4 per head and layer: scores, weights and their gradients).

    python benchmarks/scaling.py [--out DIR] [--lengths 128,256,...] [--window 256]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path

CHILD = "--child"
PATHS = ("readable", "fused", "local")
KINDS = ("layer", "model")
D_MODEL, HEADS, LAYERS, D_FF = 256, 4, 2, 1024
FIT_FROM = 1024


def build(kind: str, path: str, length: int, window: int):
    """The layer or model for one way of attending, and a function running it: step(T, backward)."""
    import torch

    from glassformer import ClassifierConfig, MultiHeadAttention, TransformerClassifier

    torch.manual_seed(0)
    local = window if path == "local" else None
    need_weights = path == "readable"
    if kind == "layer":
        layer = MultiHeadAttention(
            d_model=D_MODEL, num_heads=HEADS, window=None if local is None else (local, local)
        )

        def step(T: int, backward: bool) -> None:
            x = torch.randn(1, T, D_MODEL, requires_grad=backward)
            with torch.set_grad_enabled(backward):
                out = layer(x, need_weights=need_weights).output
                if backward:
                    out.sum().backward()

        return step
    config = ClassifierConfig(
        vocab_size=1000,
        num_classes=2,
        d_model=D_MODEL,
        num_heads=HEADS,
        num_layers=LAYERS,
        d_ff=D_FF,
        dropout=0.0,
        max_len=length,
        positional="sinusoidal",
        attention_window=local,
    )
    model = TransformerClassifier(config)

    def run_model(T: int, backward: bool) -> None:
        ids = torch.randint(1, 1000, (1, T))
        with torch.set_grad_enabled(backward):
            out = model(ids, labels=torch.zeros(1, dtype=torch.long), need_weights=need_weights)
            if backward:
                assert out.loss is not None
                out.loss.backward()
                model.zero_grad(set_to_none=True)

    return run_model


def child(spec: str) -> None:
    """One forward + backward in this fresh process; print the memory it added, in MiB."""
    s = json.loads(spec)
    step = build(s["kind"], s["path"], s["length"], s["window"])
    step(128, True)  # thread pools and kernels initialised outside the measurement
    before = _status("VmRSS")
    reset = _reset_peak()
    step(s["length"], True)
    peak = _status("VmHWM") if reset else _maxrss()
    print(json.dumps({"mib": (peak - before) / 1024, "reset": reset}))


def _status(field: str) -> int:
    """A /proc/self/status figure in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> bool:
    """Reset VmHWM to the current resident set (Linux ≥ 4.0); False where not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _maxrss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def readable_bytes(kind: str, length: int) -> int:
    """The readable path's (T, T) tensors: scores, weights and their gradients, fp32."""
    layers = 1 if kind == "layer" else LAYERS
    return 4 * HEADS * length * length * 4 * layers


def fit(points: dict[int, float]) -> float | None:
    """The slope of log(cost) on log(length) over lengths ≥ FIT_FROM (least squares)."""
    xs = [math.log(t) for t in points if t >= FIT_FROM]
    ys = [math.log(v) for t, v in points.items() if t >= FIT_FROM]
    if len(xs) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


def measure_time(args, kind: str, length: int, paths: list[str]) -> dict[str, dict[str, float]]:
    """Median seconds of forward and of forward + backward, the ways interleaved."""
    steps = {p: build(kind, p, length, args.window) for p in paths}
    result: dict[str, dict[str, float]] = {p: {} for p in paths}
    for backward, name in ((False, "forward_s"), (True, "train_s")):
        for step in steps.values():  # warm-up
            step(length, backward)
        times: dict[str, list[float]] = {p: [] for p in paths}
        for _ in range(args.repeats):
            for p, step in steps.items():
                start = time.perf_counter()
                step(length, backward)
                times[p].append(time.perf_counter() - start)
        for p in paths:
            result[p][name] = sorted(times[p])[len(times[p]) // 2]
    return result


def measure_memory(args, kind: str, length: int, path: str) -> float:
    spec = dict(kind=kind, path=path, length=length, window=args.window)
    out = subprocess.run(
        [sys.executable, __file__, CHILD, json.dumps(spec)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["mib"]


def plot(points: list[dict], fits: dict, out: Path, window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("forward_s", "forward (ms)"), ("train_s", "forward + backward (ms)")]
    panels.append(("peak_mib", "memory of forward + backward (MiB)"))
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    for row, kind in enumerate(KINDS):
        for col, (metric, label) in enumerate(panels):
            ax = axes[row][col]
            for path in PATHS:
                xs = [p["length"] for p in points if p["kind"] == kind and p["path"] == path]
                scale = 1e3 if metric.endswith("_s") else 1.0
                ys = [p[metric] * scale for p in points if p["kind"] == kind and p["path"] == path]
                k = fits[kind][path][metric]
                name = f"{path} (k = {k:.2f})" if k is not None else path
                ax.plot(xs, ys, marker="o", label=name)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length (tokens)")
            ax.set_ylabel(label)
            what = "one attention layer" if kind == "layer" else f"{LAYERS}-layer classifier"
            ax.set_title(f"{what}: {label.split(' (')[0]}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(
        f"Attention cost vs length (D={D_MODEL}, {HEADS} heads, batch 1; local: window "
        f"{window} each side; k: fitted exponent from {FIT_FROM} tokens)"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/scaling", help="folder for scaling.png/.json")
    parser.add_argument(
        "--lengths",
        default="128,256,512,1024,2048,4096,8192,16384",
        help="comma-separated sequence lengths",
    )
    parser.add_argument("--window", type=int, default=256, help="local attention's window W")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per point")
    parser.add_argument(
        "--memory-limit", type=float, default=3.0, help="GiB the readable path's (T, T) may take"
    )
    parser.add_argument(CHILD, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    import torch

    lengths = [int(t) for t in args.lengths.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    limit = args.memory_limit * 2**30
    print(
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}; D={D_MODEL}, {HEADS} heads, batch 1, local window "
        f"{args.window}; memory-limit {args.memory_limit} GiB for the readable path",
        flush=True,
    )
    points: list[dict] = []
    skipped: list[str] = []
    for kind in KINDS:
        print(f"\n{kind}: length  " + "  ".join(f"{p:>30}" for p in PATHS), flush=True)
        print(f"{'':>15}" + "  ".join(f"{'fwd ms / fwd+bwd ms / MiB':>30}" for _ in PATHS))
        for length in lengths:
            paths = [p for p in PATHS if p != "readable" or readable_bytes(kind, length) <= limit]
            if "readable" not in paths:
                skipped.append(f"{kind} {length}")
            times = measure_time(args, kind, length, paths)
            row = []
            for path in PATHS:
                if path not in paths:
                    row.append(f"{'(over the limit)':>30}")
                    continue
                mib = measure_memory(args, kind, length, path)
                point = dict(kind=kind, path=path, length=length, peak_mib=mib, **times[path])
                points.append(point)
                cell = f"{point['forward_s'] * 1e3:.1f} / {point['train_s'] * 1e3:.1f} / {mib:.0f}"
                row.append(f"{cell:>30}")
            print(f"{length:>15}" + "  ".join(row), flush=True)
    fits: dict = {}
    for kind in KINDS:
        fits[kind] = {}
        for path in PATHS:
            mine = [p for p in points if p["kind"] == kind and p["path"] == path]
            fits[kind][path] = {
                m: fit({p["length"]: max(p[m], 1e-9) for p in mine})
                for m in ("forward_s", "train_s", "peak_mib")
            }
    print(f"\nfitted exponents k (cost ∝ length^k, lengths ≥ {FIT_FROM}):")
    for kind in KINDS:
        for path in PATHS:
            f = fits[kind][path]
            print(
                f"  {kind:<6}{path:<9} "
                + "  ".join(
                    f"{m}: {f[m]:.2f}" if f[m] is not None else f"{m}: -"
                    for m in ("forward_s", "train_s", "peak_mib")
                )
            )
    longest = max(lengths)
    for kind in KINDS:
        at = {p["path"]: p for p in points if p["kind"] == kind and p["length"] == longest}
        if "fused" in at and "local" in at:
            f, lo = at["fused"], at["local"]
            print(
                f"{kind} at {longest} tokens, local vs fused: forward + backward "
                f"{lo['train_s'] * 1e3:.0f} vs {f['train_s'] * 1e3:.0f} ms "
                f"({f['train_s'] / lo['train_s']:.1f}x faster), memory {lo['peak_mib']:.0f} vs "
                f"{f['peak_mib']:.0f} MiB ({lo['peak_mib'] / f['peak_mib']:.2f}x)"
            )
    if skipped:
        print(f"readable path skipped (over {args.memory_limit} GiB): {', '.join(skipped)}")
    machine = dict(
        processor=platform.processor() or platform.machine(),
        threads=torch.get_num_threads(),
        torch=torch.__version__,
        python=platform.python_version(),
    )
    settings = dict(
        d_model=D_MODEL,
        num_heads=HEADS,
        model_layers=LAYERS,
        d_ff=D_FF,
        batch=1,
        window=args.window,
        repeats=args.repeats,
        fit_from=FIT_FROM,
        memory_limit_gib=args.memory_limit,
    )
    (out / "scaling.json").write_text(
        json.dumps(
            dict(
                machine=machine, settings=settings, points=points, exponents=fits, skipped=skipped
            ),
            indent=1,
        )
        + "\n"
    )
    plot(points, fits, out / "scaling.png", args.window)
    print(f"\nwrote {out / 'scaling.png'} and {out / 'scaling.json'}")


if __name__ == "__main__":
    main()
