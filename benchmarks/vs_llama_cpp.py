"""glassformer against llama.cpp on the same GGUF files: SmolLM2-135M-Instruct at 4 and 8 bits.

Side by side in one run, on this machine, with the same threads (torch's count):

- decode: greedy tokens/s at batch 1 (a 30-token chat prompt, ``--new-tokens`` tokens, the
  prompt's own pass included on both sides): glassformer compiled, computing from the file's
  own blocks (``for_inference("gguf")``, or ``--dtype gguf-q8``: inputs rounded to 8 bits
  as llama.cpp rounds them), against llama.cpp through llama-cpp-python, in
  interleaved rounds (llama.cpp in a child process between ours, its load not timed); the
  medians, and each as a share of the weight-read bound: the memory bandwidth (a read,
  measured in this run) over the bytes of the weights one token reads;
- prefill: time to the first token of a 512-token prompt, the same rounds;
- memory: the resident memory a fresh process adds by loading the file and decoding 32
  tokens (after, and at its peak: the high-water mark reset after the imports), imports
  excluded;
- tokens: the first 32 greedy tokens of three prompts, ours against llama.cpp's;
- perplexity (``--llama-perplexity BIN``, or ``--perplexity`` without the tool): the first
  ``--reviews`` IMDb test reviews as one text, llama.cpp's own perplexity tool (or its
  logits through llama-cpp-python, scored as the tool scores them) against the same
  computation in glassformer (chunks of ``--ctx`` tokens, each starting with BOS where the
  file asks for it, the second half of each chunk scored).

The files: the packaged Q4_1 and, made from it by llama.cpp's own quantiser (through the
given Python, ``allow_requantize``: their weights are the Q4_1's values re-encoded), Q8_0
and Q4_K_M (``--files DIR`` keeps them).

    python benchmarks/vs_llama_cpp.py --llama-cpp /path/to/venv/bin/python
        [--llama-perplexity /path/to/llama-perplexity] [--repeats 3] [--kinds Q4_1,Q8_0]
        [--dtype gguf-q8]
    glassformer bench smollm2 --llama-cpp PYTHON     (runs this after its own measurements)
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

QUANTISER = {"Q8_0": 7, "Q4_K_M": 15}  # llama.cpp's LLAMA_FTYPE_MOSTLY_* numbers

LLAMA_CHILD = r"""
import ctypes, json, sys, time
mode, path, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
job = json.loads(sys.argv[4] if sys.argv[4] != "-" else sys.stdin.read())
import llama_cpp
if mode == "quantise":
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = job["ftype"], True, threads
    sys.exit(llama_cpp.llama_model_quantize(path.encode(), job["out"].encode(),
                                            ctypes.byref(params)))
from llama_cpp import Llama
if mode == "perplexity":  # the perplexity tool's sum, from llama.cpp's own logits
    import numpy as np
    ctx = job["ctx"]
    llm = Llama(model_path=path, n_ctx=ctx, n_batch=ctx, n_ubatch=ctx, n_threads=threads,
                n_threads_batch=threads, logits_all=True, verbose=False)
    total, count = 0.0, 0
    for chunk in job["chunks"]:
        llm.reset()
        llm.eval(chunk)
        logits = np.asarray(llm.scores[ctx // 2 : ctx - 1], dtype=np.float64)
        top = logits.max(axis=1, keepdims=True)
        log_z = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
        targets = np.asarray(chunk[ctx // 2 + 1 : ctx])
        total -= float((logits[np.arange(len(targets)), targets] - log_z).sum())
        count += len(targets)
    print(json.dumps({"nll": total, "count": count}))
    sys.exit(0)
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
def peak():  # the high-water mark since clear_refs reset it
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024
before = rss()
open("/proc/self/clear_refs", "w").write("5")  # the imports' own peak forgotten
llm = Llama(model_path=path, n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=threads,
            n_threads_batch=threads, verbose=False)
def greedy(ids, n):
    out, start = [], time.perf_counter()
    for token in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        out.append(token)
        if len(out) == n:
            return time.perf_counter() - start, out
result = {}
if mode == "decode":
    greedy(job["prompt"], 8)  # warm-up
    result["decode_s"], result["tokens"] = greedy(job["prompt"], job["new"])
    llm.reset()
    start = time.perf_counter()
    llm.eval(job["long"])
    llm.sample(temp=0.0, top_k=1)
    result["prefill_s"] = time.perf_counter() - start
elif mode == "tokens":
    result["tokens"] = [greedy(ids, 32)[1] for ids in job["prompts"]]
    result["ids"] = llm.tokenize(job["text"].encode(), add_bos=False, special=True)
elif mode == "memory":
    greedy(job["prompt"], 32)
    result["after_mib"] = rss() - before
    result["peak_mib"] = peak() - before
print(json.dumps(result))
"""

OURS_MEMORY = r"""
import json, sys
import torch
from glassformer import GPT
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
def peak():  # the high-water mark since clear_refs reset it
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024
before = rss()
open("/proc/self/clear_refs", "w").write("5")  # the imports' own peak forgotten
torch.set_num_threads(int(sys.argv[2]))
model = GPT.from_pretrained(sys.argv[1], dtype=sys.argv[4])  # as the CLI reads it
with torch.inference_mode():
    model.generate(torch.tensor([json.loads(sys.argv[3])]), 32, do_sample=False, eos_id=None)
print(json.dumps({"after_mib": rss() - before, "peak_mib": peak() - before}))
"""

PROMPTS = [
    "Name three rivers in Europe.",
    "Write a haiku about the sea.",
    "What does a compiler do?",
]


def child(argv: list[str], stdin: str | None = None) -> dict:
    out = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{argv[1][:20]}... failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def llama(python: str, mode: str, path: Path, job: dict) -> dict:
    threads = str(torch.get_num_threads())
    # the job on stdin: one argument may hold no more than 128 KiB
    return child([python, "-c", LLAMA_CHILD, mode, str(path), threads, "-"], json.dumps(job))


def files(python: str, folder: Path, kinds: list[str]) -> dict[str, Path]:
    """The packaged Q4_1 and llama.cpp's re-encodings of it (made once, kept in ``folder``)."""
    from glassformer.interop.gguf import smollm2_path

    packaged = smollm2_path()
    out = {"Q4_1": packaged}
    folder.mkdir(parents=True, exist_ok=True)
    for kind in kinds:
        if kind == "Q4_1":
            continue
        target = folder / packaged.name.replace("Q4_1", kind)
        if not target.exists():
            partial = target.with_suffix(".partial")
            job = {"ftype": QUANTISER[kind], "out": str(partial)}
            out_run = subprocess.run(
                [python, "-c", LLAMA_CHILD, "quantise", str(packaged), "2", json.dumps(job)],
                capture_output=True,
                text=True,
            )
            if out_run.returncode != 0:
                raise SystemExit(f"quantising to {kind} failed:\n{out_run.stderr[-2000:]}")
            partial.rename(target)
        out[kind] = target
    return {k: out[k] for k in kinds}


def weight_bytes(model) -> int:
    """Bytes of the blocks a decoding step reads: every linear layer's (the tied head's
    table once, the fused gate/up layers' blocks not twice)."""
    from glassformer.kernels.gguf_linear import GGUFLinear

    seen: dict[int, int] = {}
    for module in model.modules():
        if isinstance(module, GGUFLinear):
            for _, kept in module.stored():  # blocks or interleaved rows: the same bytes
                seen[kept.data_ptr()] = kept.numel()
    return sum(seen.values())


def speed(
    path: Path, python: str, tokenizer, repeats: int, new: int, read: float, dtype: str
) -> dict:
    from glassformer import GPT

    model = GPT.from_pretrained(path, dtype=dtype)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": PROMPTS[0]}])
    prompt = torch.tensor([tokenizer.encode(chat)])
    long = torch.randint(1000, 40000, (1, 512), generator=torch.Generator().manual_seed(0))
    job = {"prompt": prompt[0].tolist(), "new": new, "long": long[0].tolist()}
    ours: dict[str, list[float]] = {"decode_s": [], "prefill_s": []}
    theirs: dict[str, list[float]] = {"decode_s": [], "prefill_s": []}
    with torch.inference_mode():
        model.generate(prompt, 8, do_sample=False, eos_id=None, compile=True)  # compiles
        model.generate(long, 1, do_sample=False, eos_id=None, compile=True)
        for _ in range(repeats):
            start = time.perf_counter()
            model.generate(prompt, new, do_sample=False, eos_id=None, compile=True)
            ours["decode_s"].append(time.perf_counter() - start)
            start = time.perf_counter()
            model.generate(long, 1, do_sample=False, eos_id=None, compile=True)
            ours["prefill_s"].append(time.perf_counter() - start)
            result = llama(python, "decode", path, job)
            for key in theirs:
                theirs[key].append(result[key])
    per_token = weight_bytes(model)
    bound = read / per_token
    out = {"weight_bytes_per_token": per_token, "bound_tokens_per_s": bound}
    for who, times in (("glassformer", ours), ("llama.cpp", theirs)):
        rate = new / statistics.median(times["decode_s"])
        out[who] = {
            "decode_tokens_per_s": rate,
            "share_of_bound": rate / bound,
            "prefill_512_s": statistics.median(times["prefill_s"]),
        }
    return out


def memory(path: Path, python: str, prompt: list[int], dtype: str) -> dict:
    threads = str(torch.get_num_threads())
    argv = [sys.executable, "-c", OURS_MEMORY, str(path), threads, json.dumps(prompt), dtype]
    ours = child(argv)
    return {"glassformer": ours, "llama.cpp": llama(python, "memory", path, {"prompt": prompt})}


def q8_0(x: torch.Tensor) -> torch.Tensor:
    """``x`` as llama.cpp hands it to a Q8_0 product (``quantize_row_q8_0``): per 32 values,
    d = max|x| / 127, q = x / d rounded half away from zero, and q · fp16(d) multiplied."""
    blocks = x.float().reshape(*x.shape[:-1], -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    scaled = blocks * torch.where(d > 0, 1 / d, torch.zeros_like(d))
    q = scaled.sign() * (scaled.abs() + 0.5).floor()
    return (q * d.half().float()).reshape(x.shape)


def llama_cpp_rounding(model):
    """Hooks rounding glassformer's fp32 computation where llama.cpp's rounds (its defaults on
    a Q8_0 file): every product's input to 8 bits in blocks of 32, and the rotated queries,
    the keys and values (its cache is fp16) and the attention weights to fp16. Only to show
    where the two differ; glassformer itself keeps fp32."""
    from glassformer.kernels.gguf_linear import GGUFLinear

    handles = [
        m.register_forward_pre_hook(lambda _, args: (q8_0(args[0]), *args[1:]))
        for m in model.modules()
        if isinstance(m, GGUFLinear)
    ]
    ends = ("hook_rot_q", "hook_rot_k", "attn.hook_v", "hook_pattern")
    halves = [(n, lambda x, name: x.half().float()) for n in model.hook_names() if n.endswith(ends)]
    return handles, model.hooks(halves)


def same_tokens(path: Path, python: str, tokenizer, emulate: bool, dtype: str) -> dict:
    """The first 32 greedy tokens of each prompt, glassformer's against llama.cpp's; with
    ``emulate``, also with llama.cpp's rounding put into glassformer's computation."""
    from glassformer import GPT

    model = GPT.from_pretrained(path, dtype=dtype)
    prompts = [
        tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": p}]))
        for p in PROMPTS
    ]
    theirs = llama(python, "tokens", path, {"prompts": prompts, "text": PROMPTS[0]})

    def agreeing() -> list[int]:
        with torch.inference_mode():
            ours = [
                model.generate(torch.tensor([ids]), 32, do_sample=False, eos_id=None)
                for ids in prompts
            ]
        return [
            next(
                (
                    i
                    for i, (a, b) in enumerate(zip(o[0, len(ids) :].tolist(), t, strict=False))
                    if a != b
                ),
                32,
            )
            for o, ids, t in zip(ours, prompts, theirs["tokens"], strict=True)
        ]

    out = {"tokens_agreeing_of_32": agreeing()}
    if emulate:
        handles, hooks = llama_cpp_rounding(model)
        with hooks:
            out["with_llama_cpp_rounding"] = agreeing()
        for handle in handles:
            handle.remove()
    out["same_ids"] = theirs["ids"] == tokenizer.encode(PROMPTS[0])
    return out


def perplexity(
    path: Path,
    binary: str | None,
    text_file: Path,
    ctx: int,
    tokenizer,
    add_bos,
    dtype: str,
    python: str,
) -> dict:
    """llama.cpp's perplexity against glassformer's replica of its computation: chunks of
    ``ctx`` tokens, the first BOS where the file asks for it, the second half of each scored.
    llama.cpp's from its own tool (``binary``), or, without one, from its logits through
    llama-cpp-python, scored by that same replica."""
    from glassformer import GPT

    ids = tokenizer.encode(text_file.read_text())
    if add_bos is not None:
        ids = [add_bos, *ids]
    chunks = [ids[start : start + ctx] for start in range(0, len(ids) // ctx * ctx, ctx)]
    if add_bos is not None:
        chunks = [[add_bos, *chunk[1:]] for chunk in chunks]
    if binary:
        threads = str(torch.get_num_threads())
        run = subprocess.run(
            [binary, "-m", str(path), "-f", str(text_file), "-c", str(ctx), "-t", threads],
            capture_output=True,
            text=True,
        )
        found = re.search(r"Final estimate: PPL = ([0-9.]+)", run.stdout + run.stderr)
        if not found:
            raise SystemExit(f"llama-perplexity gave no estimate:\n{run.stderr[-2000:]}")
        theirs, source = float(found.group(1)), "llama-perplexity"
    else:
        sums = llama(python, "perplexity", path, {"ctx": ctx, "chunks": chunks})
        theirs, source = math.exp(sums["nll"] / sums["count"]), "llama-cpp-python logits"
    model = GPT.from_pretrained(path, dtype=dtype)
    total, count = 0.0, 0
    with torch.inference_mode():
        for chunk in chunks:
            logits = model(torch.tensor([chunk])).logits[0].double()
            scored = torch.log_softmax(logits[ctx // 2 : ctx - 1], dim=-1)
            targets = torch.tensor(chunk[ctx // 2 + 1 : ctx])
            total -= scored.gather(1, targets[:, None]).sum().item()
            count += len(targets)
    return {"llama.cpp": theirs, "glassformer": math.exp(total / count), "source": source}


def adds_bos(path: Path) -> bool:
    """Whether llama.cpp puts BOS before a text of this file (its perplexity tool does)."""
    import gguf

    field = gguf.GGUFReader(path).fields.get("tokenizer.ggml.add_bos_token")
    return bool(field.parts[-1][0]) if field is not None else False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-cpp", metavar="PYTHON", required=True)
    parser.add_argument("--llama-perplexity", metavar="BIN")
    parser.add_argument(
        "--perplexity",
        action="store_true",
        help="measure perplexity even without --llama-perplexity: llama.cpp's from its "
        "logits through llama-cpp-python, scored as its tool scores them",
    )
    parser.add_argument("--kinds", default="Q4_1,Q8_0,Q4_K_M")
    parser.add_argument("--files", default=str(Path(tempfile.gettempdir()) / "gf-gguf"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--reviews", type=int, default=100)
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--dtype",
        choices=("gguf", "gguf-q8"),
        default="gguf",
        help="glassformer's precision: the file's blocks exactly (gguf), or with every "
        "product's input rounded to 8 bits as llama.cpp rounds it (gguf-q8)",
    )
    args = parser.parse_args()
    from generate import bandwidth  # benchmarks/generate.py

    from glassformer.interop.gguf import read_gguf_tokenizer

    kinds = args.kinds.split(",")
    paths = files(args.llama_cpp, Path(args.files), kinds)
    tokenizer = read_gguf_tokenizer(paths["Q4_1"] if "Q4_1" in paths else paths[kinds[0]])
    read = bandwidth("cpu")["sum"]
    print(f"glassformer --dtype {args.dtype}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; memory read "
          f"{read / 1e9:.1f} GB/s (measured now)")  # fmt: skip
    figures: dict = {"bandwidth_bytes_per_s": read, "dtype": args.dtype, "files": {}}
    for kind, path in paths.items():
        chat = tokenizer.apply_chat_template([{"role": "user", "content": PROMPTS[0]}])
        row = speed(
            path, args.llama_cpp, tokenizer, args.repeats, args.new_tokens, read, args.dtype
        )
        row["memory_mib"] = memory(path, args.llama_cpp, tokenizer.encode(chat), args.dtype)
        emulate = kind == "Q8_0" and args.dtype == "gguf"
        row["tokens"] = same_tokens(path, args.llama_cpp, tokenizer, emulate, args.dtype)
        figures["files"][kind] = row
        print(f"\n{kind} ({path.stat().st_size / 2**20:.1f} MiB; "
              f"{row['weight_bytes_per_token'] / 2**20:.1f} MiB of weights a token, bound "
              f"{row['bound_tokens_per_s']:.0f} tokens/s)")  # fmt: skip
        g, ll = row["glassformer"], row["llama.cpp"]
        for name, r in (("glassformer", g), ("llama.cpp", ll)):
            m = row["memory_mib"][name]
            print(f"  {name:<12} decode {r['decode_tokens_per_s']:6.1f} tokens/s "
                  f"({r['share_of_bound']:.0%} of the bound)  prefill 512: "
                  f"{r['prefill_512_s'] * 1e3:6.0f} ms  memory +{m['after_mib']:.0f} MiB "
                  f"(peak +{m['peak_mib']:.0f})")  # fmt: skip
        mem = row["memory_mib"]
        print(f"  glassformer / llama.cpp: decode "
              f"{g['decode_tokens_per_s'] / ll['decode_tokens_per_s']:.2f}x, prefill "
              f"{ll['prefill_512_s'] / g['prefill_512_s']:.2f}x, memory after "
              f"{mem['glassformer']['after_mib'] / mem['llama.cpp']['after_mib']:.2f}x; greedy "
              f"tokens agreeing (of 32): {row['tokens']['tokens_agreeing_of_32']}")  # fmt: skip
        if "with_llama_cpp_rounding" in row["tokens"]:
            print("  with llama.cpp's rounding emulated (8-bit inputs to every product, fp16 "
                  f"q/k/v/weights): {row['tokens']['with_llama_cpp_rounding']}")  # fmt: skip
    if args.llama_perplexity or args.perplexity:
        from glassformer.data.corpora import load_corpus

        reviews = [t for t, _ in load_corpus("imdb", "classify").test[: args.reviews]]
        text_file = Path(args.files) / f"imdb-test-{args.reviews}.txt"
        text_file.write_text("\n\n".join(reviews))
        bos = tokenizer.bos_id if adds_bos(paths[kinds[0]]) else None
        for kind, path in paths.items():
            ppl = perplexity(
                path,
                args.llama_perplexity,
                text_file,
                args.ctx,
                tokenizer,
                bos,
                args.dtype,
                args.llama_cpp,
            )
            figures["files"][kind]["perplexity"] = ppl
            change = ppl["glassformer"] / ppl["llama.cpp"] - 1
            print(f"\n{kind} perplexity, {args.reviews} IMDb test reviews, chunks of "
                  f"{args.ctx}: llama.cpp ({ppl['source']}) {ppl['llama.cpp']:.4f}, glassformer "
                  f"{ppl['glassformer']:.4f} ({change:+.2%})")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
