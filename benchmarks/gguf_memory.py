"""SmolLM2-135M-Instruct from its packaged GGUF, computing from the file's blocks: the time to
load, the decoding speed and the peak resident memory of one process doing both.

One process: ``GPT.from_pretrained`` on the packaged Q4_1 file, ``for_inference("gguf")``
(with ``--straight``: ``from_pretrained(name, dtype="gguf")``, read straight into the blocks),
then ``--new-tokens`` greedy tokens after a short prompt (the tokens are all generated: no
stop token), ``--rounds`` times. It prints one JSON line: the load time (from_pretrained +
for_inference), the decoding tokens/s of the fastest round, the process's peak resident
memory (``ru_maxrss``) and the first tokens.
Run it as a whole process beside another tree's code to compare two versions:

    python benchmarks/gguf_memory.py [--new-tokens 32] [--threads 2] [--rounds 4] [--straight]
    PYTHONPATH=/other/tree/src python benchmarks/gguf_memory.py     # the same, that code
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import torch

from glassformer import GPT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--rounds", type=int, default=1, help="decode this many times, keep the best"
    )
    parser.add_argument(
        "--straight",
        action="store_true",
        help='read the file straight into its blocks: from_pretrained(name, dtype="gguf")',
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    if args.straight:
        model = GPT.from_pretrained("SmolLM2-135M-Instruct", dtype="gguf")
    else:
        model = GPT.from_pretrained("SmolLM2-135M-Instruct").for_inference("gguf")
    loaded = time.perf_counter() - start
    prompt = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 2]])
    times = []
    with torch.no_grad():
        for _ in range(args.rounds):
            start = time.perf_counter()
            out = model.generate(prompt, args.new_tokens, do_sample=False, eos_id=None)
            times.append(time.perf_counter() - start)
    decoded = min(times)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "load_s": round(loaded, 3),
                "tokens_per_s": round(args.new_tokens / decoded, 2),
                "peak_rss_mib": round(peak_mib, 1),
                "tokens": out[0, prompt.shape[1] :][:8].tolist(),
            }
        )
    )


if __name__ == "__main__":
    main()
