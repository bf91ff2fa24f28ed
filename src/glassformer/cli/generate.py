"""Continue a prompt with a trained GPT (a run directory from `glassformer train lm`), a
Hugging Face GPT-2 or Llama directory, or SmolLM2-135M-Instruct."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

import torch

from glassformer.cli import _decoding
from glassformer.cli._common import add_dtype_argument, for_inference, one_token, reading_options
from glassformer.cli._decoding import add_generation_arguments, generation_config
from glassformer.generation import GenerationConfig
from glassformer.inference import load_run

HELP = "continue a prompt with a trained language model"
EXAMPLE = 'glassformer generate --model runs/austen --prompt "It is a truth" --max-new-tokens 200'


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", default="runs/lm", help="run or checkpoint directory, or SmolLM2-135M-Instruct"
    )
    p.add_argument("--prompt", default="\n", help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=300)
    add_sampling_arguments(p)
    p.add_argument("--stop", action="append", default=[], help="stop at this token (repeatable)")
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument(
        "--no-stream",
        action="store_true",
        help="print the text when it is finished instead of token by token",
    )
    p.add_argument("--steer", metavar="FILE",
                   help="add a probes file's class difference while generating")  # fmt: skip
    p.add_argument("--alpha", type=float, default=4.0, help="how many times it is added")
    p.add_argument("--steer-hook", help="where (default: the file's best probe's hook)")


SAMPLING = (*_decoding.SAMPLING, "compile")


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    """The options of sampling (shared with `glassformer chat`)."""
    add_generation_arguments(p, SAMPLING, do_sample=True, temperature=0.8)
    add_dtype_argument(p)


def sampling_config(args: argparse.Namespace) -> tuple[GenerationConfig, torch.Generator | None]:
    """The GenerationConfig and random generator the sampling options ask for (checked
    before any model is read)."""
    if args.max_new_tokens <= 0:
        raise ValueError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    return generation_config(args)


def run(args: argparse.Namespace) -> int:
    if args.num_samples <= 0:
        raise ValueError(f"--num-samples must be positive, got {args.num_samples}")
    config, g = sampling_config(args)
    model, tok = load_run(args.model, kind="gpt", **reading_options(args.model, args.dtype))
    ids = tok.encode(args.prompt)
    if not ids:
        raise ValueError(f"the prompt {args.prompt!r} encodes to no tokens")
    stops = [_stop_id(tok, text) for text in args.stop]
    # The stop tokens need the tokenizer; so does the rule that ids past it (a padded
    # embedding, as in Qwen2 and Pythia) are never chosen: they could not be printed.
    config = replace(config, eos_id=tuple(stops) or None, vocab_limit=tok.vocab_size)
    steering = _steering(args)
    model = for_inference(model, args.dtype, tok)  # once the inputs are known to be good
    prompt = torch.tensor([ids] * args.num_samples)
    stream = args.num_samples == 1 and not args.no_stream
    streamer = Printer(tok, ids) if stream else None
    with model.hooks(steering):
        out = model.generate(
            prompt, args.max_new_tokens, generation_config=config, generator=g, streamer=streamer
        )
    if stream:
        print()
        return 0
    for i, row in enumerate(out.tolist()):
        if args.num_samples > 1:
            print(f"--- sample {i + 1}")
        print(tok.decode(row))
    return 0


def _steering(args: argparse.Namespace) -> list:
    """The hook that adds --alpha times the --steer file's vector, or none."""
    if args.steer is None:
        if args.steer_hook is not None:
            raise ValueError("--steer-hook names where a --steer file's vector goes; give --steer")
        return []
    from glassformer.inspect.probes import add, read_vector

    hook, vector, meta = read_vector(args.steer, args.steer_hook)
    print(f"steering: {args.alpha} × the {meta.get('labels', ['?', '?'])[1]!r} − "
          f"{meta.get('labels', ['?', '?'])[0]!r} difference at {hook} (made on "
          f"{meta.get('model', 'an unnamed model')})", file=sys.stderr)  # fmt: skip
    return [(hook, add(vector, args.alpha))]


def _stop_id(tok, text: str) -> int:
    token_id = one_token(tok, text, "--stop")
    if token_id == tok.unk_id and tok.id_to_token(token_id) != text:
        raise ValueError(
            f"--stop {text!r} is not in the model's vocabulary (it would stop at any unknown token)"
        )
    return token_id


class Printer:
    """Prints the text as it grows (the prompt too, when ``echo``). Decoding the whole
    sequence each time (not token by token) keeps characters that span several byte-level
    tokens whole."""

    def __init__(self, tok, prompt_ids: list[int], *, echo: bool = True) -> None:
        self.tok = tok
        self.ids = list(prompt_ids)
        self.shown = tok.decode(self.ids)
        if echo:
            sys.stdout.write(self.shown)
            sys.stdout.flush()

    def __call__(self, new_ids: torch.Tensor) -> None:
        self.ids.append(int(new_ids[0]))
        text = self.tok.decode(self.ids)
        if text.startswith(self.shown) and not text.endswith("\ufffd"):
            sys.stdout.write(text[len(self.shown) :])
            sys.stdout.flush()
            self.shown = text
