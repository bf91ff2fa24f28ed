"""Decoding speed: glassformer's GPT at each precision, next to Hugging Face, and against the
weight-read bound.

The medium GPT shape (6 layers, 6 heads, 384 wide, vocabulary 65) with random weights, a
16-token prompt and 256 new tokens, greedy, at batch 1 and 8. The position tables hold
16 + 256 = 272 positions on both sides so that neither model crops its context.

Contenders, run interleaved, ``--repeats`` times, median kept:
- Hugging Face ``GPT2LMHeadModel.generate`` (its KV cache on), fp32: the baseline;
- glassformer's plain cached path (``static_cache=False``), fp32;
- glassformer's static path (``glassformer.generation.static``) in fp32, bf16, int8 and
  int4 (``model.for_inference(dtype)``), and with ``--compile`` each compiled too
  (``compile=True``).

For each: tokens/s, the ratio to Hugging Face, whether the tokens equal Hugging Face's
(fp32) or the fp32 static path's, and the fraction of the weight-read bound reached: a
decoding step reads every weight once, so it cannot take less than (bytes of the weights a
step reads) ÷ (memory bandwidth). The bandwidth is measured in the same run: reading a
1 GiB buffer, and a matrix-vector product over one (the larger is kept). Prefill (the
prompt) is timed against a training-style forward of the same tokens.

With ``--shape smollm2`` the model is SmolLM2-135M's Llama shape (30 layers, 576 wide, 9
heads over 3 key/value heads, vocabulary 49,152, tied head) with random weights, next to
transformers' ``LlamaForCausalLM`` holding the same weights. With ``--device cuda`` everything
runs on the GPU (the default precisions there: fp32 and bf16, Hugging Face in both).

    pip install transformers   # the peer; glassformer itself does not need it
    python benchmarks/generate.py [--repeats 5] [--new-tokens 256] [--compile]
    python benchmarks/generate.py --device cuda --shape smollm2 --compile
    glassformer bench generate
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics

import torch
from _common import timed
from torch import nn

from glassformer import GPT, GPTConfig
from glassformer.generation.static import static_cache
from glassformer.interop import to_gpt2_state
from glassformer.interop.llama import from_llama_state
from glassformer.models import families

SHAPE = dict(vocab_size=65, d_model=384, num_heads=6, num_layers=6)
SMOLLM2 = dict(  # SmolLM2-135M's config.json, the shape only
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    tie_word_embeddings=True,
    bos_token_id=0,
    eos_token_id=None,
    pad_token_id=0,
)


def build_smollm2(positions: int):
    """SmolLM2-135M's shape with random weights, in glassformer and in transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(**SMOLLM2, max_position_embeddings=positions)).eval()
    config = families.LlamaConfig.from_hf(hf.config.to_dict())
    ours = GPT(config).eval()
    ours.load_state_dict(from_llama_state(hf.state_dict(), config))
    return ours, hf


def build(prompt_len: int, new_tokens: int):
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
    hf.load_state_dict(gpt2_state_dict(ours))  # the same weights on both sides
    return ours, hf


def gpt2_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """``model``'s weights under GPT2LMHeadModel's names (its Conv1D stores them transposed)."""
    return to_gpt2_state(model)


def step_bytes(model: nn.Module) -> int:
    """Bytes a decoding step reads: the blocks' weights and the output head's (the token
    and position tables give one row each; a tied head reads the whole token table)."""
    tensors = {id(t): t for t in [*model.blocks.parameters(), *model.blocks.buffers()]}
    tensors |= {id(t): t for t in [*model.lm_head.parameters(), *model.lm_head.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def bandwidth(device: str, gib: float = 1.0, repeats: int = 5) -> dict[str, float]:
    """Bytes/s of reading a ``gib`` GiB fp32 buffer: by a sum, and by a matrix-vector
    product (the decoding step's own pattern); best of ``repeats``."""
    n = int(gib * 2**30) // 4
    cols = 4096
    big = torch.rand(n // cols, cols, device=device)
    x = torch.rand(cols, device=device)
    out = {}
    for name, fn in (("sum", lambda: big.sum()), ("matrix-vector", lambda: big @ x)):
        fn = synced(fn, device)
        fn()
        best = min(timed(fn, 1) for _ in range(repeats))
        out[name] = big.numel() * 4 / best
    return out


def synced(fn, device: str):
    """``fn`` that returns only once the GPU has finished its work (a no-op on the CPU)."""
    if device != "cuda":
        return fn

    def run():
        out = fn()
        torch.cuda.synchronize()
        return out

    return run


def contenders(models: dict, hf, prompt: torch.Tensor, new_tokens: int, hf_bf16=None) -> dict:
    mask = torch.ones_like(prompt)

    def hf_generate(hf=hf):
        return hf.generate(
            prompt,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            use_cache=True,
        )

    fns = {"Hugging Face generate, fp32": hf_generate}
    if hf_bf16 is not None:
        fns["Hugging Face generate, bf16"] = lambda: hf_generate(hf_bf16)
    fp32 = models["fp32"]
    fns["glassformer plain cache, fp32"] = lambda: fp32.generate(
        prompt, new_tokens, static_cache=False
    )
    for name, model in models.items():
        compile = name.endswith("compiled")
        fns[f"glassformer static, {name}"] = lambda model=model, compile=compile: model.generate(
            prompt, new_tokens, compile=compile
        )
    return {name: synced(fn, prompt.device.type) for name, fn in fns.items()}


def measure(fns: dict, repeats: int, tokens: int) -> tuple[dict[str, float], dict]:
    outs = {}
    with torch.inference_mode():
        for name, fn in fns.items():  # warm-up (compiles), and each makes every token
            outs[name] = fn()
            assert outs[name].size(1) == tokens, (name, tuple(outs[name].shape))
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(repeats):
            for name, fn in fns.items():  # interleaved: drift hits every contender alike
                times[name].append(timed(fn, 1))
    return {name: statistics.median(t) for name, t in times.items()}, outs


def prefill(models: dict, hf, prompt_len: int, repeats: int, vocab: int) -> dict[str, float]:
    """Tokens/s of a prompt of ``prompt_len`` through the static path's prefill (into a
    static cache, last logits only) and through a training-style forward (all logits)."""
    fp32 = models["fp32"]
    device = next(fp32.parameters()).device
    ids = torch.randint(1, vocab, (1, prompt_len), device=device)
    fns = {
        "glassformer prefill (static cache)": lambda: fp32(
            ids, cache=static_cache(fp32, 1, prompt_len), logits_to_keep=1
        ),
        "glassformer forward, no cache": lambda: fp32(ids),
        "Hugging Face forward, no cache": lambda: hf(ids, use_cache=False),
    }
    fns = {name: synced(fn, device.type) for name, fn in fns.items()}
    with torch.inference_mode():
        for fn in fns.values():
            fn()
        times = {
            name: statistics.median(timed(fn, 1) for _ in range(repeats))
            for name, fn in fns.items()
        }
    return {name: prompt_len / t for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--dtypes", help="default: fp32,bf16,int8,int4 (cuda: fp32,bf16)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--shape", default="gpt", choices=["gpt", "smollm2"])
    parser.add_argument("--compile", action="store_true", help="also each dtype compiled")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    args.dtypes = args.dtypes or ("fp32,bf16" if cuda else "fp32,bf16,int8,int4")
    positions = args.prompt_len + args.new_tokens
    if args.shape == "smollm2":
        ours, hf = build_smollm2(max(positions, 256))  # 256: the prefill test
        shape, vocab = "SmolLM2-135M's shape (30L, 576 wide, 9/3 heads)", SMOLLM2["vocab_size"]
    else:
        ours, hf = build(args.prompt_len, args.new_tokens)
        shape, vocab = "GPT 6L/6H/384", SHAPE["vocab_size"]
    ours, hf = ours.to(args.device), hf.to(args.device)
    hf_bf16 = copy.deepcopy(hf).to(torch.bfloat16) if cuda else None
    import transformers

    models = {}
    for dtype in args.dtypes.split(","):
        models[dtype] = copy.deepcopy(ours).for_inference(dtype)
        if args.compile:
            models[f"{dtype} compiled"] = models[dtype]
    read = bandwidth(args.device)
    bw = max(read.values())
    where = torch.cuda.get_device_name() if cuda else f"{torch.get_num_threads()} threads"
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, {where}; "
        f"{shape}, vocabulary {vocab}, random weights, "
        f"{args.prompt_len}-token prompt + {args.new_tokens} new tokens, greedy"
    )
    print(
        "memory bandwidth measured: "
        + ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in read.items())
        + f"; the bound uses {bw / 1e9:.1f} GB/s"
    )
    figures: dict = {"device": where, "shape": args.shape, "bandwidth_bytes_per_s": read}
    figures["decode"] = {}
    for B in map(int, args.batch_sizes.split(",")):
        prompt = torch.randint(1, vocab, (B, args.prompt_len), device=args.device)
        fns = contenders(models, hf, prompt, args.new_tokens, hf_bf16)
        medians, outs = measure(fns, args.repeats, args.prompt_len + args.new_tokens)
        hf_name = "Hugging Face generate, fp32"
        reference = outs["glassformer static, fp32"]
        print(f"\nbatch {B}{'':<32}  seconds  tokens/s  vs HF   bound   same tokens as")
        rows = {}
        for name, seconds in medians.items():
            model = models.get(name.removeprefix("glassformer static, "), models["fp32"])
            bound = step_bytes(model if "glassformer" in name else ours) / bw
            step = seconds / args.new_tokens
            same_hf = bool(torch.equal(outs[name], outs[hf_name]))
            same_fp32 = bool(torch.equal(outs[name], reference))
            same = (
                "HF and fp32"
                if same_hf and same_fp32
                else "HF"
                if same_hf
                else ("fp32 static" if same_fp32 else "neither")
            )
            rows[name] = dict(
                seconds=seconds,
                tokens_per_s=B * args.new_tokens / seconds,
                vs_hf=medians[hf_name] / seconds,
                bound_fraction=bound / step,
                step_mb=step_bytes(model) / 1e6 if "glassformer" in name else None,
                same_as_hf=same_hf,
                same_as_fp32_static=same_fp32,
            )
            r = rows[name]
            print(
                f"  {name:<36} {seconds:7.3f} {r['tokens_per_s']:9.0f} {r['vs_hf']:6.2f}x "
                f"{r['bound_fraction']:6.0%}   {same}"
            )
        figures["decode"][B] = rows
    prompt = min(256, args.prompt_len + args.new_tokens)  # within the models' context
    rates = prefill(models, hf, prompt, args.repeats, vocab)
    figures["prefill_tokens_per_s"] = rates
    print(f"\nprefill, one {prompt}-token prompt")
    for name, rate in rates.items():
        print(f"  {name:<40} {rate:9.0f} tokens/s")
    print(
        "\nweights read per step: "
        + ", ".join(f"{d} {step_bytes(m) / 1e6:.1f} MB" for d, m in models.items())
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
