"""Run the speed benchmarks of a source checkout's benchmarks/ folder, one after another.

Each benchmark runs glassformer side by side with a peer in one process, interleaved,
several repeats, and prints medians and ratios:

  attention      MultiHeadAttention and EncoderLayer vs nn.MultiheadAttention and
                 nn.TransformerEncoderLayer (and F.scaled_dot_product_attention)
  gpt-train      GPT training step vs nanoGPT (--nanogpt PATH) and Hugging Face GPT-2,
                 tokens/s and model FLOPs utilisation against this run's matmul peak
  seq2seq-train  Seq2SeqTransformer training step vs a model on nn.Transformer
  classifier     TransformerClassifier training and inference vs nn.TransformerEncoder
                 (its fast path)
  generate       decoding vs Hugging Face generate: the plain and static cached paths,
                 fp32/bf16/int8/int4 (--compile: compiled too), the weight-read bound
  embed          SentenceEncoder (all-MiniLM-L6-v2) vs sentence-transformers
  hooks          hook points and run_with_cache vs TransformerLens on GPT-2 small: time and
                 cache size (--before DIR: the forward before the hook points)
  smollm2        SmolLM2-135M-Instruct's GGUF: load time and peak memory, and greedy
                 tokens/s at batch 1 and 8 at each precision, vs transformers (needs
                 accelerate) and llama.cpp (--llama-cpp PYTHON)
  llama-cpp      SmolLM2's GGUF files (the packaged Q4_1; Q8_0 and Q4_K_M made from it by
                 llama.cpp's quantiser) computed from their own blocks against llama.cpp:
                 decode and prefill speed, memory, greedy tokens (needs --llama-cpp; with
                 --llama-perplexity BIN also perplexity against llama.cpp's own tool)
  nanogpt-lm     5 minutes of char-level training each, then validation loss (slow)
  bf16-curve     the medium GPT trained under bf16 autocast and in fp32: loss curves
                 side by side and the speed-up (slow; needs a CPU with native bf16)
  modern-block   the modern (Llama) block against GPT-2's at equal parameters, trained on
                 austen for the same minutes: validation losses (slow)
  malloc         GPT training steps with glibc's default malloc and with freed memory
                 kept, as `glassformer train` runs (separate processes, alternating)
  precision-quality  held-out perplexity at fp32, bf16, int8 and int4 (SmolLM2 on IMDb;
                 --run DIR: a `train lm` run on its validation text)
  precision      what `--dtype auto` and `--bf16 auto` chose on this machine: each cached
                 measurement with its spread and age (--refresh: measure them all again;
                 --model M: that model's decoding products)
  kernels        what the GGUF products chose on this machine: from how many rows of a
                 prompt the weight is decoded rather than multiplied from its rows
                 interleaved, exact and with gguf-q8, with the figures (--refresh: measure
                 again)
  scaling        time and peak memory of one attention layer and of a model against
                 sequence length (128 to 16,384 tokens): the readable path, the fused one
                 and local attention; fitted exponents, a PNG and a JSON in --out (slow)

Without names it runs attention, gpt-train, seq2seq-train and classifier.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HELP = "run the side-by-side speed benchmarks"
EXAMPLE = "glassformer bench attention generate --repeats 3"

SCRIPTS = {
    "attention": "attention.py",
    "gpt-train": "gpt_train.py",
    "seq2seq-train": "seq2seq_train.py",
    "classifier": "classifier.py",
    "generate": "generate.py",
    "embed": "embed.py",
    "smollm2": "smollm2.py",
    "hooks": "hooks.py",
    "nanogpt-lm": "nanogpt_lm.py",
    "bf16-curve": "bf16_curve.py",
    "malloc": "malloc.py",
    "modern-block": "modern_block.py",
    "scaling": "scaling.py",
    "precision-quality": "precision_quality.py",
    "llama-cpp": "vs_llama_cpp.py",
    "precision": "",  # in this process: glassformer.kernels.precision, no script
    "kernels": "",  # in this process: glassformer.kernels.gguf_choice, no script
}
DEFAULT = ("attention", "gpt-train", "seq2seq-train", "classifier")
REPEATABLE = {
    "attention",
    "gpt-train",
    "seq2seq-train",
    "classifier",
    "generate",
    "embed",
    "malloc",
    "smollm2",
    "llama-cpp",
    "hooks",
    "scaling",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks: {', '.join(SCRIPTS)}")
    p.add_argument("--nanogpt", help="nanoGPT checkout (or bare mirror) for gpt-train, nanogpt-lm")
    p.add_argument("--repeats", type=int, default=None, help="repeats per measurement")
    p.add_argument("--out", default=None, help="scaling: the folder for its PNG and JSON")
    p.add_argument(
        "--llama-cpp",
        metavar="PYTHON",
        help="smollm2: also llama.cpp, through a Python that has llama-cpp-python",
    )
    p.add_argument(
        "--llama-perplexity",
        metavar="BIN",
        help="llama-cpp: also perplexity against llama.cpp's llama-perplexity tool",
    )
    p.add_argument(
        "--refresh",
        action="store_true",
        help="precision, kernels: measure again (precision: every cached entry)",
    )
    p.add_argument(
        "--model", help="precision: also what --dtype auto chooses for this model, and why"
    )
    p.add_argument(
        "--benchmarks",
        default=None,
        help="the benchmarks/ folder (default: the one beside this source checkout)",
    )


def benchmarks_dir(given: str | None) -> Path:
    folder = Path(given) if given else Path(__file__).resolve().parents[3] / "benchmarks"
    if not (folder / "attention.py").is_file():
        raise ValueError(
            f"no benchmarks in {folder}: glassformer bench runs the scripts of a source "
            "checkout; pass its folder with --benchmarks"
        )
    return folder


def run(args: argparse.Namespace) -> int:
    unknown = [n for n in args.names if n not in SCRIPTS]
    if unknown:
        raise ValueError(f"unknown benchmark {unknown[0]!r}; known: {', '.join(SCRIPTS)}")
    if args.repeats is not None and args.repeats <= 0:
        raise ValueError(f"--repeats must be a positive integer, got {args.repeats}")
    if "llama-cpp" in args.names and not args.llama_cpp:
        raise ValueError("llama-cpp needs --llama-cpp PYTHON (a Python with llama-cpp-python)")
    if "nanogpt-lm" in args.names and not args.nanogpt:
        raise ValueError("nanogpt-lm needs --nanogpt PATH (a nanoGPT checkout)")
    if args.nanogpt and not Path(args.nanogpt).exists():
        raise ValueError(f"--nanogpt {args.nanogpt}: no such directory")
    for name in ("precision", "kernels"):  # reports of this process's cache, no script
        if name in args.names:
            if len(args.names) > 1:
                raise ValueError(f"glassformer bench {name} runs alone; name no other benchmark")
            if name == "kernels":
                return kernels_report(args.refresh)
            return precision_report(args.refresh, args.model)
    folder = benchmarks_dir(args.benchmarks)
    failed = []
    for name in args.names or DEFAULT:
        command = [sys.executable, str(folder / SCRIPTS[name])]
        if args.nanogpt and name in ("gpt-train", "nanogpt-lm"):
            command += ["--nanogpt", args.nanogpt]
        if args.repeats and name in REPEATABLE:
            command += ["--repeats", str(args.repeats)]
        if args.out and name == "scaling":
            command += ["--out", args.out]
        if args.llama_cpp and name in ("smollm2", "llama-cpp"):
            command += ["--llama-cpp", args.llama_cpp]
        if args.llama_perplexity and name == "llama-cpp":
            command += ["--llama-perplexity", args.llama_perplexity]
        print(f"\n=== {name}: {' '.join(command[1:])}", flush=True)
        if subprocess.run(command).returncode != 0:
            failed.append(name)
    if failed:
        print(f"glassformer bench: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def precision_report(refresh: bool, model_name: str | None) -> int:
    """Print this machine's precision measurements (measured again with ``refresh``), and
    ``model_name``'s choice."""
    from glassformer.kernels import precision

    print(f"precision measurements in {precision.cache_root() / precision.CACHE_FILE}:")
    if refresh:
        for key, old, new in precision.refresh():
            was = f"was {old.describe()}" if old else "was expired or untrusted"
            print(f"  {_label(key)}: {_choice(new)} ({new.describe()}; {was})")
    else:
        for key, m in precision.cached():
            print(f"  {_label(key)}: {_choice(m)} ({m.describe()})")
    for key, why in precision.skipped():  # what could not be listed (or measured again)
        print(f"  skipped {_label(key) if key else 'the whole file'}: {why}")
    if model_name:
        from glassformer.cli._common import describe_choice
        from glassformer.inference import load_run

        model, tokenizer = load_run(model_name)
        if refresh:
            precision.decoding_measurement(model, refresh=True)
        model = model.for_inference("auto", tokenizer=tokenizer)  # speed, then fidelity
        print(f"  {model_name} decoding, --dtype auto: {describe_choice(model)}")
    return 0


def kernels_report(refresh: bool) -> int:
    """Print what the GGUF products chose on this machine, exact and with ``gguf-q8``
    (measured now where not cached, or with ``refresh``)."""
    from glassformer.kernels import gguf_choice
    from glassformer.kernels.gguf_kernels import kernels

    if kernels() is None:
        print("the GGUF kernels are not built on this machine: nothing to choose")
        return 1
    from glassformer.kernels.gguf_linear import INTERLEAVED

    print(f"GGUF kernel choices in {gguf_choice.cache_root() / gguf_choice.CACHE_FILE}:")
    for rounded in (False, True):
        for kind in INTERLEAVED:
            measured = gguf_choice.crossover(kind, rounded, refresh=refresh)
            print(f"  {gguf_choice.cache_key(kind, rounded)}:\n    {measured.describe()}")
    return 0


def _label(key: str) -> str:
    """A cache key's shapes, shortened: the count of products and the first of them (a
    key not of that form, as written, cut at 60 characters)."""
    parts = key.split("; ")
    dims = parts[2].split() if len(parts) > 2 else []
    if not dims:
        return repr(key[:60])
    more = f" and {len(dims) - 1} other shapes" if len(dims) > 1 else ""
    return f"{dims[0]}{more}{' as linear layers' if key.endswith('; linear') else ''}"


def _choice(m) -> str:
    return "bf16" if m.bf16_faster else "fp32"
