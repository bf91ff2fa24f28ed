"""Generation speed: glassformer's GPT with and without its KV cache, next to Hugging Face.

The medium GPT shape (6 layers, 6 heads, 384 wide, vocabulary 65) with random weights,
a 16-token prompt and 256 new tokens, greedy, at batch 1 and 8. The position tables hold
16 + 256 = 272 positions on both sides so that neither model crops its context.
Contenders run interleaved, several repeats; the median tokens/s and the ratio to
Hugging Face's ``GPT2LMHeadModel.generate`` (its KV cache on) are printed.

    pip install transformers   # the peer; glassformer itself does not need it
    python benchmarks/generate.py [--repeats 5] [--new-tokens 256] [--dtype bfloat16]

``--dtype bfloat16`` casts both models' weights (decoding one token at a time reads every
weight once per token, so on a CPU half the bytes is nearly half the time).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from glassformer import GPT, GPTConfig

SHAPE = dict(vocab_size=65, d_model=384, num_heads=6, num_layers=6)


def build(prompt_len: int, new_tokens: int, dtype: torch.dtype):
    torch.manual_seed(0)
    positions = prompt_len + new_tokens
    ours = GPT(GPTConfig(**SHAPE, max_len=positions, dropout=0.0, pad_id=None)).eval()
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        message = "this benchmark compares with transformers: pip install transformers"
        raise SystemExit(message) from None
    config = GPT2Config(
        vocab_size=SHAPE["vocab_size"],
        n_positions=positions,
        n_embd=SHAPE["d_model"],
        n_layer=SHAPE["num_layers"],
        n_head=SHAPE["num_heads"],
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=None,  # never stop early: both sides make exactly new_tokens
        pad_token_id=0,
    )
    hf = GPT2LMHeadModel(config).eval()
    return ours.to(dtype), hf.to(dtype)


def contenders(ours, hf, prompt: torch.Tensor, new_tokens: int) -> dict:
    mask = torch.ones_like(prompt)

    def hf_generate():
        return hf.generate(
            prompt,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            use_cache=True,
        )

    return {
        "glassformer, KV cache": lambda: ours.generate(prompt, new_tokens, use_cache=True),
        "glassformer, no cache (reference path)": lambda: ours.generate(
            prompt, new_tokens, use_cache=False
        ),
        "Hugging Face GPT2LMHeadModel.generate": hf_generate,
    }


def measure(fns: dict, repeats: int, tokens: int) -> dict[str, float]:
    for name, fn in fns.items():  # warm-up, and a check that each makes every token
        out = fn()
        assert out.size(1) == tokens, (name, tuple(out.shape))
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():  # interleaved: drift hits every contender alike
            start = time.perf_counter()
            with torch.inference_mode():
                fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ours, hf = build(args.prompt_len, args.new_tokens, getattr(torch, args.dtype))
    import transformers

    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{torch.get_num_threads()} threads; GPT 6L/6H/384, vocabulary 65, "
        f"{args.prompt_len}-token prompt + {args.new_tokens} new tokens, greedy, {args.dtype}"
    )
    for B in map(int, args.batch_sizes.split(",")):
        prompt = torch.randint(1, SHAPE["vocab_size"], (B, args.prompt_len))
        fns = contenders(ours, hf, prompt, args.new_tokens)
        medians = measure(fns, args.repeats, args.prompt_len + args.new_tokens)
        hf_time = medians["Hugging Face GPT2LMHeadModel.generate"]
        print(f"\nbatch {B}")
        for name, seconds in medians.items():
            rate = B * args.new_tokens / seconds
            print(
                f"  {name:<40} {seconds:7.3f} s  {rate:8.0f} tokens/s  "
                f"{hf_time / seconds:5.2f}x Hugging Face"
            )


if __name__ == "__main__":
    main()
