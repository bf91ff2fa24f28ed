"""bf16 against fp32, before and after issue 43: how faithful and how fast.

- "cast": the model cast wholly to bf16 (what ``--dtype bf16`` did before: the residual
  stream, norms and logits in bf16 too);
- "bf16": today's ``for_inference("bf16")``: the blocks' products in bf16, everything else fp32.

For each: top-1 agreement and mean KL of the next-token distributions against fp32 on the
calibration text (what ``--dtype auto`` decides on) and on the held-out text
(``glassformer.fidelity_texts``), and greedy decoding speed (tokens/s, batch 1, a 16-token
prompt, ``--new-tokens`` new ones, the contenders interleaved ``--repeats`` times, median kept)
with the ratio to fp32. Run it alone: other work on the machine slows the rounds unevenly.

    python benchmarks/bf16_fidelity.py --model SmolLM2-135M-Instruct
    python benchmarks/bf16_fidelity.py --model runs/austen      # a run directory
    python benchmarks/bf16_fidelity.py --medium                 # the medium GPT, random weights
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from glassformer import GPT, GPTConfig
from glassformer.data.tokenizers import CharTokenizer
from glassformer.fidelity_texts import CALIBRATION, HELD_OUT
from glassformer.inference import load_run
from glassformer.kernels.fidelity import calibration_inputs, compare, output_logits


def contenders(model):
    cast = copy.deepcopy(model).eval().to(torch.bfloat16)
    return {
        "fp32": copy.deepcopy(model).for_inference("fp32"),
        "cast": cast,
        "bf16": copy.deepcopy(model).for_inference("bf16"),
    }


def tokens_per_s(model, prompt, new_tokens) -> float:
    start = time.perf_counter()
    model.generate(prompt, new_tokens)
    return new_tokens / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="a run directory or a packaged model's name")
    p.add_argument("--medium", action="store_true", help="the medium GPT with random weights")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=64)
    args = p.parse_args()
    if args.medium:
        torch.manual_seed(0)
        tok = CharTokenizer(sorted(set(CALIBRATION + HELD_OUT)))
        shape = dict(d_model=384, num_heads=6, num_layers=6, max_len=272)
        model = GPT(GPTConfig(vocab_size=tok.vocab_size, **shape)).eval()
    else:
        model, tok = load_run(args.model)
    with open("/proc/cpuinfo") as f:
        cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    print(
        f"{args.model or 'medium GPT (random weights)'} on {cpu}, {torch.get_num_threads()} threads"
    )
    runs = contenders(model)
    for name, text in (("calibration", CALIBRATION), ("held-out", HELD_OUT)):
        inputs = calibration_inputs(model, tok, text)
        reference = output_logits(runs["fp32"], inputs)
        for kind in ("cast", "bf16"):
            f = compare(reference, output_logits(runs[kind], inputs))
            figures = f"top-1 {f.top1:.2%}  KL {f.kl:.5f} nats  ({f.positions} positions)"
            print(f"  {kind:4s} {name:11s} {figures}")
    prompt = torch.tensor([tok.encode(HELD_OUT)[:16]])
    for run in runs.values():  # warm-up
        tokens_per_s(run, prompt, 8)
    speeds: dict[str, list[float]] = {kind: [] for kind in runs}
    for _ in range(args.repeats):
        for kind, run in runs.items():
            speeds[kind].append(tokens_per_s(run, prompt, args.new_tokens))
    fp32 = statistics.median(speeds["fp32"])
    for kind, figures in speeds.items():
        median = statistics.median(figures)
        print(f"  decode {kind:4s} {median:7.1f} tokens/s  {median / fp32:.2f}x fp32")


if __name__ == "__main__":
    main()
