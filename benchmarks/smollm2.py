"""SmolLM2-135M-Instruct from its packaged GGUF: glassformer next to Hugging Face transformers.

Two measurements, side by side in one run:

1. Loading the Q4_1 GGUF file into an fp32 model: glassformer's
   ``GPT.from_pretrained("SmolLM2-135M-Instruct")`` against transformers'
   ``AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)``. Each load runs in a
   fresh Python process, the two alternating, ``--repeats`` times; the time is the load call
   alone (imports excluded, and reported apart), the memory is the process's peak resident
   size during the load (its high-water mark reset after the imports) minus its resident
   size just before it (``/proc/self/clear_refs``, ``VmHWM``).
2. Greedy decoding with the KV cache on both sides: the same prompt (a chat-formatted
   question, repeated for batch 8), ``--new-tokens`` new tokens each, exactly (no stop token
   on either side). transformers in fp32 (``--dtype bfloat16`` casts it); glassformer at
   each of ``--dtypes`` (``model.for_inference``), eager and, with ``--compile``, compiled.
   The models are loaded once, in this process; the contenders run interleaved, the median
   of ``--repeats`` is kept. The tokens each chose are compared with transformers' up to
   the first end-of-turn token (transformers' ``min_new_tokens`` hides that token from its
   choice; glassformer may choose it).
3. With ``--llama-cpp PYTHON`` (a Python that has ``llama-cpp-python``, built outside this
   repository), llama.cpp on the same packaged GGUF (Q4_1) at batch 1, in a child process
   with as many threads, between the rounds: tokens/s of its generation loop, load excluded;
   then ``vs_llama_cpp.py``: glassformer computing from the file's own blocks against
   llama.cpp on the same files at 4 and 8 bits (decode, prefill, memory, tokens).

    python benchmarks/smollm2.py [--repeats 3] [--new-tokens 128] [--dtypes fp32,int4]
        [--compile] [--llama-cpp /path/to/venv/bin/python]
    glassformer bench smollm2
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from _common import load_child  # benchmarks/_common.py

CHILD = load_child(
    imports="""kind = sys.argv[1]
if kind == "glassformer":
    from glassformer import GPT
else:
    from transformers import AutoModelForCausalLM
    from glassformer.interop.gguf import smollm2_path""",
    load="""if kind == "glassformer":
    model = GPT.from_pretrained("SmolLM2-135M-Instruct")
else:
    path = smollm2_path()
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )""",
)

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
    return ours.eval(), hf.to(dtype), tokenizer


LLAMA_CHILD = r"""
import json, sys, time
from llama_cpp import Llama
path, new_tokens, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ids = json.loads(sys.argv[4])
llm = Llama(model_path=path, n_ctx=len(ids) + new_tokens + 8, n_threads=threads,
            n_threads_batch=threads, verbose=False)
def run():
    out, start = [], time.perf_counter()
    for token in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        out.append(token)
        if len(out) == new_tokens:
            return time.perf_counter() - start, out
run()  # warm-up
seconds, out = run()
print(json.dumps({"seconds": seconds, "tokens": out}))
"""


def llama_cpp(python: str, ids: list[int], new_tokens: int) -> tuple[float, list[int]]:
    """(seconds, tokens) of llama.cpp's greedy generation on the packaged GGUF, batch 1."""
    from glassformer.interop.gguf import smollm2_path

    argv = [python, "-c", LLAMA_CHILD, str(smollm2_path()), str(new_tokens)]
    argv += [str(torch.get_num_threads()), json.dumps(ids)]
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"llama.cpp failed:\n{out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["seconds"], result["tokens"]


def decode_rates(
    models: dict, hf, tokenizer, batch: int, new_tokens: int, repeats: int, llama: str | None
) -> dict:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three rivers in Europe."}]
    )
    prompt = torch.tensor([tokenizer.encode(text)] * batch)
    mask = torch.ones_like(prompt)
    fns = {
        "transformers": lambda: hf.generate(
            prompt,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_id,
        ),
    }
    for name, model in models.items():
        compile = name.endswith("compiled")
        fns[f"glassformer {name}"] = lambda model=model, compile=compile: model.generate(
            prompt, new_tokens, do_sample=False, eos_id=None, compile=compile
        )
    outs = {}
    times: dict[str, list[float]] = {name: [] for name in fns}
    llama_runs: list[tuple[float, list[int]]] = []
    with torch.inference_mode():
        for name, fn in fns.items():  # warm-up (and compilation); every contender makes every token
            outs[name] = fn()
            assert outs[name].shape == (batch, prompt.size(1) + new_tokens), name
        for _ in range(repeats):
            for name, fn in fns.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
            if llama and batch == 1:
                llama_runs.append(llama_cpp(llama, prompt[0].tolist(), new_tokens))
    rates = {name: batch * new_tokens / statistics.median(t) for name, t in times.items()}
    start = prompt.size(1)
    same = {
        name: _same_until_end(out, outs["transformers"], start, tokenizer)
        for name, out in outs.items()
    }
    if llama_runs:
        rates["llama.cpp (Q4_1 GGUF)"] = new_tokens / statistics.median(s for s, _ in llama_runs)
        theirs = torch.tensor([llama_runs[0][1]])
        same["llama.cpp (Q4_1 GGUF)"] = _same_until_end(
            theirs, outs["transformers"][:, start:], 0, tokenizer
        )
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
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16"], help="transformers'"
    )
    parser.add_argument("--dtypes", default="fp32,bf16,int8,int4", help="glassformer's")
    parser.add_argument("--compile", action="store_true", help="also each dtype compiled")
    parser.add_argument("--llama-cpp", metavar="PYTHON", help="a Python with llama-cpp-python")
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
    models = {}
    for dtype in args.dtypes.split(","):
        models[dtype] = copy.deepcopy(ours).for_inference(dtype)
        if args.compile:
            models[f"{dtype} compiled"] = models[dtype]
    del ours
    figures["decode"] = {}
    for batch in map(int, args.batch_sizes.split(",")):
        result = decode_rates(
            models, hf, tokenizer, batch, args.new_tokens, args.repeats, args.llama_cpp
        )
        figures["decode"][batch] = result
        rates = result["tokens_per_s"]
        print(f"\ngreedy decoding, batch {batch}, {args.new_tokens} new tokens")
        for name, rate in rates.items():
            print(
                f"  {name:<28} {rate:8.1f} tokens/s  {rate / rates['transformers']:5.2f}x "
                f"transformers{'' if name == 'transformers' else ', same tokens: '}"
                f"{'' if name == 'transformers' else result['same_tokens'][name]}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    if args.llama_cpp:  # the same GGUF files on both sides, 4 and 8 bits
        here = Path(__file__).resolve().parent
        command = [sys.executable, str(here / "vs_llama_cpp.py"), "--llama-cpp", args.llama_cpp]
        subprocess.run([*command, "--repeats", str(args.repeats)], check=True)


if __name__ == "__main__":
    main()
