"""Chat with an instruction-tuned model: SmolLM2-135M-Instruct by default.

Each message you type joins the conversation, which the model's chat template turns into
its prompt; the reply streams as it is written and joins the conversation too. The oldest
turns are dropped when the conversation outgrows the model's context. Ctrl-C stops a
reply; type /reset to start again, /exit (or Ctrl-D) to leave. With standard input from a
pipe or file, each line is one message and only the replies are printed, a paragraph each.

--model takes SmolLM2-135M-Instruct, a Hugging Face Llama directory whose tokenizer has a
chat template, or a glassformer run whose tokenizer_config.json holds one.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import replace

import torch

from glassformer.cli._common import for_inference, reading_options
from glassformer.cli.generate import Printer, add_sampling_arguments, sampling_config
from glassformer.errors import ChatTemplateError
from glassformer.inference import load_run

HELP = "chat with an instruction-tuned model (SmolLM2-135M-Instruct), replies streamed"
EXAMPLE = 'glassformer chat --system "You answer in one sentence." --max-new-tokens 64'
DEFAULT_MODEL = "SmolLM2-135M-Instruct"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, help="the model to chat with")
    p.add_argument("--system", help="a system message (default: the template's own, if any)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="the longest reply, in tokens")
    add_sampling_arguments(p)


def run(args: argparse.Namespace) -> int:
    config, g = sampling_config(args)
    model, tok = load_run(args.model, kind="gpt", **reading_options(args.model, args.dtype))
    if tok.chat_template is None:
        raise ValueError(
            f"{args.model} has no chat template, so it is not a chat model; "
            "use `glassformer generate` to continue a text"
        )
    # Ids past the tokenizer (a padded embedding) are never chosen: they could not be printed.
    config = replace(config, eos_id=(tok.eos_id,), vocab_limit=tok.vocab_size)
    budget = model.config.max_len - args.max_new_tokens
    if budget <= 0:
        raise ValueError(
            f"--max-new-tokens {args.max_new_tokens} leaves no room in the model's "
            f"{model.config.max_len}-token context"
        )
    model = for_inference(model, args.dtype, tok)  # once the inputs are known to be good
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"Chatting with {args.model}. /reset starts again, /exit or Ctrl-D leaves.")
    for text in _messages(interactive):
        if text in ("/exit", "/quit"):
            break
        if text == "/reset":
            messages = list(system)
            print("(a new conversation)")
            continue
        messages.append({"role": "user", "content": text})
        try:
            ids = conversation_ids(tok, messages, budget)
        except ChatTemplateError as e:  # the tokenizer does not know its file: name the model
            raise (e if e.source else ChatTemplateError(args.model, e.problem)) from None
        if ids is None:
            messages.pop()
            print(f"(that message does not fit in {budget} tokens; say it shorter)")
            continue
        printer = Printer(tok, ids, echo=False)
        try:
            model.generate(
                torch.tensor([ids]),
                args.max_new_tokens,
                generation_config=config,
                generator=g,
                streamer=printer,
            )
        except KeyboardInterrupt:  # Ctrl-C stops this reply, not the chat
            if not interactive:
                raise
            print(" (stopped)", end="")
        print("\n")
        reply = tok.decode(printer.ids[len(ids) :]).strip()
        messages.append({"role": "assistant", "content": reply})
    return 0


def conversation_ids(tok, messages: list[dict[str, str]], budget: int) -> list[int] | None:
    """The prompt ids of ``messages`` ending in an open assistant turn, dropping the oldest
    exchanges (a system message stays) until it fits in ``budget`` tokens; changes
    ``messages`` in place to what was kept. None when the last message alone does not fit."""
    while True:
        ids = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True))
        if len(ids) <= budget:
            return ids
        first = 1 if messages[0]["role"] == "system" else 0
        if len(messages) - first <= 1:
            return None
        del messages[first : first + 2]  # the oldest user message and the reply to it


def _messages(interactive: bool) -> Iterator[str]:
    """The user's messages: typed after a prompt, or one per line of standard input."""
    while True:
        try:
            line = input("> ") if interactive else sys.stdin.readline()
        except EOFError:
            print()
            return
        if not interactive and not line:
            return
        if line.strip():
            yield line.strip()
