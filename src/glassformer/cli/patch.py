"""Activation patching: where does a model keep what its answer needs?

Runs the CORRUPT text with one activation taken from the CLEAN text (the same number of
tokens), for every layer × position of the residual stream (or of the attention or MLP
outputs, --what), or for every layer × head (--what z), and measures the logit of --answer
minus that of --wrong at the last position (a language model: one token each) or of the
class --answer minus the class --wrong (a classifier: two of its labels). A place whose
clean value brings the clean answer back carries it. Prints the clean and corrupted
differences and the places that restore most, and draws the effect (--out).


    glassformer patch --model SmolLM2-135M-Instruct --clean "The capital of France is"
        --corrupt "The capital of Italy is" --answer " Paris" --wrong " Rome" --out patch.png
"""

from __future__ import annotations

import argparse

HELP = "activation patching between a clean and a corrupted text"
EXAMPLE = (
    "glassformer patch --model SmolLM2-135M-Instruct --clean "
    '"The capital of France is" --corrupt "The capital of Italy is" --answer " Paris" '
    '--wrong " Rome" --out patching.png'
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", required=True, help="a language model or classifier run, SmolLM2-135M-Instruct"
    )
    p.add_argument("--clean", required=True, help="the text the model gets right")
    p.add_argument("--corrupt", required=True, help="the same number of tokens, changed")
    p.add_argument("--answer", required=True, help="the clean text's answer (a token or a label)")
    p.add_argument("--wrong", required=True, help="the corrupted text's answer (a token, a label)")
    p.add_argument(
        "--what", choices=("resid_pre", "attn_out", "mlp_out", "z"), default="resid_pre",
        help="what to patch: the residual stream entering each layer, the attention or MLP "
        "outputs (per position), or each head's z (all positions)",
    )  # fmt: skip
    p.add_argument("--out", default="patch.png", help="the heatmap (.png, .svg, .pdf)")


# the kinds that read one text and answer with a token or a class
PATCHABLE_KINDS = ("gpt", "encoder_lm", "classifier", "gpt_classifier", "bert_classifier")


def _answers(model, tokenizer, args: argparse.Namespace) -> tuple[int, int]:
    """--answer and --wrong as ids: one token each, or a classifier's labels."""
    from glassformer.cli._common import one_token
    from glassformer.inference import read_labels

    if model.kind in ("gpt", "encoder_lm"):
        return one_token(tokenizer, args.answer, "--answer"), one_token(
            tokenizer, args.wrong, "--wrong"
        )
    labels = read_labels(args.model)
    for flag, label in (("--answer", args.answer), ("--wrong", args.wrong)):
        if label not in labels:
            raise ValueError(f"{flag} {label!r} is not a label of the model: {', '.join(labels)}")
    return labels.index(args.answer), labels.index(args.wrong)


def run(args: argparse.Namespace) -> int:
    import torch

    from glassformer.inference import load_run
    from glassformer.inspect import activation_patching, logit_difference
    from glassformer.viz.attention import save_figure, token_labels
    from glassformer.viz.lens import plot_patching

    model, tokenizer = load_run(args.model)
    if model.kind not in PATCHABLE_KINDS:
        raise ValueError(
            f"{args.model} holds a {model.kind!r} model; `patch` runs a language model or a "
            "classifier on two texts (a translator: glassformer.inspect.activation_patching "
            "from Python, with (source, target) pairs)"
        )
    clean, corrupt = tokenizer.encode(args.clean), tokenizer.encode(args.corrupt)
    if len(clean) != len(corrupt) or not clean:
        raise ValueError(
            f"--clean and --corrupt must be the same number of tokens, got {len(clean)} and "
            f"{len(corrupt)}"
        )
    answer, wrong = _answers(model, tokenizer, args)
    metric = logit_difference(answer, wrong)
    clean_ids, corrupt_ids = torch.tensor([clean]), torch.tensor([corrupt])
    with torch.no_grad():
        clean_value = float(metric(model(clean_ids).logits))
        corrupt_value = float(metric(model(corrupt_ids).logits))
    effect = activation_patching(model, clean_ids, corrupt_ids, metric, what=args.what)
    if args.what == "z":
        columns, label, plural = [f"head {h + 1}" for h in range(effect.size(1))], "head", "heads"
    else:
        columns = token_labels(tokenizer, clean)
        label, plural = "position (clean token)", "positions"
    print(f"logit({args.answer!r}) - logit({args.wrong!r}): clean {clean_value:.3f}, "
          f"corrupted {corrupt_value:.3f}")  # fmt: skip
    span = clean_value - corrupt_value
    flat = effect.flatten().argsort(descending=span >= 0)[:5]
    for index in flat.tolist():
        layer, place = divmod(index, effect.size(1))
        share = (effect[layer, place] - corrupt_value) / span if span else 0.0
        print(f"  layer {layer + 1}, {columns[place]}: {effect[layer, place]:.3f} "
              f"({float(share):.0%} of the way back)")  # fmt: skip
    fig = plot_patching(
        effect, columns=columns, column_label=label, clean=clean_value, corrupt=corrupt_value
    )
    save_figure(fig, args.out)
    print(f"{args.out}: {effect.size(0)} layers × {effect.size(1)} {plural}")
    return 0
