"""Continue a prompt with a trained GPT (a run directory from `glassformer train lm`)."""

from __future__ import annotations

import argparse

import torch

from glassformer.cli._common import load_model_dir

HELP = "continue a prompt with a trained language model"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="runs/lm", help="run or checkpoint directory")
    p.add_argument("--prompt", default="\n", help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=300)
    p.add_argument("--greedy", action="store_true", help="arg-max instead of sampling")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--seed", type=int, default=None, help="makes sampling reproducible")


def run(args: argparse.Namespace) -> int:
    if args.max_new_tokens <= 0:
        raise ValueError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    model, tok, _ = load_model_dir(args.model, "gpt")
    ids = tok.encode(args.prompt)
    if not ids:
        raise ValueError(f"the prompt {args.prompt!r} encodes to no tokens")
    g = torch.Generator().manual_seed(args.seed) if args.seed is not None else None
    prompt = torch.tensor([ids] * args.num_samples)
    out = model.generate(
        prompt,
        args.max_new_tokens,
        do_sample=not args.greedy,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        generator=g,
    )
    for i, row in enumerate(out.tolist()):
        if args.num_samples > 1:
            print(f"--- sample {i + 1}")
        print(tok.decode(row))
    return 0
