"""SmolLM2-135M-Instruct from its packaged GGUF: glassformer next to Hugging Face transformers.

Two measurements, side by side in one run:

1. Loading the Q4_1 GGUF file into an fp32 model: glassformer's
   ``GPT.from_pretrained("SmolLM2-135M-Instruct")`` against transformers'
   ``AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)``. Each load runs in a
   fresh Python process, the two alternating, ``--repeats`` times; the time is the load call
   alone (imports excluded, and reported apart), the memory is the process's peak resident
   size after the load minus its resident size just before it (``ru_maxrss``, ``/proc``).
2. Greedy decoding with the KV cache on both sides, fp32 (``--dtype bfloat16`` casts both):
   the same prompt (a chat-formatted question, repeated for batch 8), ``--new-tokens`` new
   tokens each, exactly (no stop token on either side). The two models are loaded once,
   in this process; the contenders run interleaved, the median of ``--repeats`` is kept.
   The tokens each side chose are compared up to the first end-of-turn token (transformers'
   ``min_new_tokens`` hides that token from its choice; glassformer may choose it).

    python benchmarks/smollm2.py [--repeats 3] [--new-tokens 128] [--dtype bfloat16]
    glassformer bench smollm2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

CHILD = r"""
import json, resource, sys, time
kind = sys.argv[1]
t0 = time.perf_counter()
import torch
if kind == "glassformer":
    from glassformer import GPT
else:
    from transformers import AutoModelForCausalLM
    from glassformer.interop.gguf import smollm2_path
imported = time.perf_counter() - t0

def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024

before = rss_kib()
t1 = time.perf_counter()
if kind == "glassformer":
    model = GPT.from_pretrained("SmolLM2-135M-Instruct")
else:
    path = smollm2_path()
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
seconds = time.perf_counter() - t1
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
params = sum(p.numel() for p in model.parameters())
print(json.dumps({"import_s": imported, "load_s": seconds,
                  "peak_mib": (peak - before) / 1024, "params": params}))
"""

LOADERS = ("glassformer", "transformers")


def load_times(repeats: int) -> dict[str, dict[str, float]]:
    """Median load seconds, import seconds and peak MiB of each loader (fresh processes)."""
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in LOADERS}
    for _ in range(repeats):
        for kind in LOADERS:  # alternating: drift hits both alike
            out = subprocess.run(
                [sys.executable, "-c", CHILD, kind], capture_output=True, text=True, check=False
            )
            if out.returncode != 0:
                raise SystemExit(f"loading with {kind} failed:\n{out.stderr[-2000:]}")
            runs[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {
        kind: {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        for kind, rows in runs.items()
    }


def build(dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    from glassformer import load_run
    from glassformer.interop.gguf import smollm2_path

    ours, tokenizer = load_run("SmolLM2-135M-Instruct")
    path = smollm2_path()
    hf = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    return ours.to(dtype).eval(), hf.to(dtype), tokenizer


def decode_rates(ours, hf, tokenizer, batch: int, new_tokens: int, repeats: int) -> dict:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three rivers in Europe."}]
    )
    prompt = torch.tensor([tokenizer.encode(text)] * batch)
    mask = torch.ones_like(prompt)
    fns = {
        "glassformer": lambda: ours.generate(prompt, new_tokens, do_sample=False, eos_id=None),
        "transformers": lambda: hf.generate(
            prompt,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_id,
        ),
    }
    outs = {}
    with torch.inference_mode():
        for name, fn in fns.items():  # warm-up; every contender makes every token
            outs[name] = fn()
            assert outs[name].shape == (batch, prompt.size(1) + new_tokens), name
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(repeats):
            for name, fn in fns.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    same = _same_until_end(outs["glassformer"], outs["transformers"], prompt.size(1), tokenizer)
    rates = {name: batch * new_tokens / statistics.median(t) for name, t in times.items()}
    return {"tokens_per_s": rates, "same_tokens": same}


def _same_until_end(a: torch.Tensor, b: torch.Tensor, start: int, tokenizer) -> bool:
    for x, y in zip(a[:, start:].tolist(), b[:, start:].tolist(), strict=True):
        end = x.index(tokenizer.eos_id) if tokenizer.eos_id in x else len(x)
        if x[:end] != y[:end]:
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--skip-load", action="store_true", help="only the decoding rates")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    import transformers

    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{torch.get_num_threads()} threads; SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised)"
    )
    figures: dict = {}
    if not args.skip_load:
        loads = load_times(args.repeats)
        figures["load"] = loads
        print(f"\nloading the GGUF into fp32, median of {args.repeats} fresh processes")
        for kind, f in loads.items():
            print(
                f"  {kind:<13} load {f['load_s']:6.2f} s   peak +{f['peak_mib']:6.0f} MiB   "
                f"(imports {f['import_s']:.1f} s, {f['params'] / 1e6:.1f} M parameters)"
            )
        g, t = loads["glassformer"], loads["transformers"]
        print(
            f"  glassformer: {t['load_s'] / g['load_s']:.2f}x faster, "
            f"{g['peak_mib'] / t['peak_mib']:.2f}x the peak memory"
        )
    ours, hf, tokenizer = build(getattr(torch, args.dtype))
    figures["decode"] = {}
    for batch in map(int, args.batch_sizes.split(",")):
        result = decode_rates(ours, hf, tokenizer, batch, args.new_tokens, args.repeats)
        figures["decode"][batch] = result
        ours_rate, their_rate = result["tokens_per_s"].values()
        print(
            f"\ngreedy decoding, batch {batch}, {args.new_tokens} new tokens, {args.dtype}: "
            f"glassformer {ours_rate:.1f} tokens/s, transformers {their_rate:.1f} tokens/s: "
            f"{ours_rate / their_rate:.2f}x; the same tokens: {result['same_tokens']}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
