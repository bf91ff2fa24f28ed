"""Features: what a sparse autoencoder sees in a text.

Reads TEXT with the SAE's model (--model, by default the one it was trained on), takes the
activations at the SAE's hook point and encodes them: which features fire on which token,
the --top strongest drawn over the text, and for each its --contexts top-activating places
in a corpus (--corpus or --data; by default the SAE's own). --sae takes a `train sae` run
directory or a SAELens directory (cfg.json + sae_weights.safetensors). --out FILE.png draws
the features over the tokens; FILE.html writes the offline viewer with its features tab.

    glassformer features --sae runs/sae "It is a truth universally acknowledged" --out f.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "a sparse autoencoder's features on a text, with their top contexts"
EXAMPLE = 'glassformer features --sae runs/sae "It is a truth universally acknowledged"'


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sae", required=True, help="a `train sae` run directory or a SAELens one")
    p.add_argument("text", help="the text to read")
    p.add_argument("--model", help="the model the SAE reads (default: the one it was trained on)")
    p.add_argument("--top", type=int, default=8, help="features shown: the text's strongest")
    p.add_argument("--contexts", type=int, default=5, help="top contexts per feature")
    p.add_argument("--corpus", help="a bundled corpus for the contexts (default: the SAE's)")
    p.add_argument("--data", help="a text file for the contexts instead")
    p.add_argument("--windows", type=int, default=64, help="windows of the corpus searched")
    p.add_argument("--out", default="features.png", help=".png/.svg/.pdf, or .html (viewer)")


def run(args: argparse.Namespace) -> int:
    import torch

    from glassformer.inference import load_run
    from glassformer.inspect.features import feature_activations, top_contexts
    from glassformer.models.sae import SparseAutoencoder
    from glassformer.viz.attention import token_labels

    sae = SparseAutoencoder.from_pretrained(args.sae)
    name = args.model or sae.config.model_name
    if not name:
        raise ValueError(f"{args.sae} does not say which model it reads: give --model")
    model, tokenizer = load_run(name)
    ids = tokenizer.encode(args.text)
    if not ids:
        raise ValueError("the text has no tokens")
    values = feature_activations(model, sae, torch.tensor([ids]))  # (T, d_sae)
    if sae.config.skip_first:
        values[0] = 0  # the SAE was not trained on a window's first position
    features = [f for f in values.amax(0).argsort(descending=True)[: args.top].tolist()
                if values[:, f].max() > 0]  # fmt: skip
    tokens = token_labels(tokenizer, ids)
    windows = _corpus_windows(args, sae, tokenizer)
    found = top_contexts(model, sae, windows, features, n=args.contexts)
    contexts = {f: [_context(tokenizer, windows, c) for c in found[f]] for f in features}
    _print(tokens, values, features, contexts)
    about = f"{sae.config.hook_name}, {sae.config.d_sae} features"
    result = {"tokens": tokens, "features": features, "values": values[:, features],
              "contexts": contexts, "sae": about}  # fmt: skip
    _write(model, tokenizer, args, result)
    return 0


def _corpus_windows(args: argparse.Namespace, sae, tokenizer):
    """Windows of the SAE's context size from the validation text of the chosen corpus."""
    import torch

    from glassformer.data import corpora, files

    if args.data:
        text = files.read_text(args.data)
    else:
        corpus = args.corpus or sae.config.dataset_path
        if corpus not in corpora.CORPORA:
            raise ValueError(
                f"the SAE was trained on {corpus!r}, not a bundled corpus: give --corpus or --data"
            )
        text = corpora.load_corpus(corpus, "lm").validation
    block = sae.config.context_size
    ids = torch.tensor(tokenizer.encode(text[: block * 8 * args.windows]), dtype=torch.long)
    n = min(len(ids) // block, args.windows)
    if n < 1:
        raise ValueError(f"the text for the contexts has fewer than {block} tokens")
    return ids[: n * block].view(n, block)


def _context(tokenizer, windows, c) -> dict:
    row = windows[c.window].tolist()
    return {"before": tokenizer.decode(row[max(0, c.position - 12) : c.position]),
            "token": tokenizer.decode(row[c.position : c.position + 1]),
            "after": tokenizer.decode(row[c.position + 1 : c.position + 4]),
            "value": round(c.value, 4)}  # fmt: skip


def _print(tokens, values, features, contexts) -> None:
    print("token: its strongest features (value)")
    for t, token in enumerate(tokens):
        row = values[t]
        top = [f for f in row.argsort(descending=True)[:3].tolist() if row[f] > 0]
        print(f"  {token!r:>16}: " + ", ".join(f"{f} ({float(row[f]):.2f})" for f in top))
    for f in features:
        print(f"feature {f}: fires most on")
        for c in contexts[f]:
            print(f"  {c['value']:8.2f}  …{c['before']!r} [{c['token']!r}] {c['after']!r}…")


def _write(model, tokenizer, args: argparse.Namespace, result: dict) -> None:
    from glassformer.viz.attention import save_figure
    from glassformer.viz.attribution import plot_features

    out = Path(args.out)
    if out.suffix.lower() == ".html":
        from glassformer.viz.viewer import features_page

        features_page(model, tokenizer, args.text, result).save(out)
        print(f"{out}: the viewer, features tab")
        return
    figure = plot_features(result["values"], tokens=result["tokens"], features=result["features"])
    save_figure(figure, out)
    print(f"{out}: {len(result['features'])} features over {len(result['tokens'])} tokens")
