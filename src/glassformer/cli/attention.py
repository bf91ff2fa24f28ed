"""Draw a model's attention weights as heatmaps with the tokens on the axes.

One real forward pass on TEXT; for each kind of attention the model has (encoder
self-attention; decoder self-attention; the translator's cross-attention), a grid with a
row per layer and a column per head, or the one map --layer/--head choose (counting
from 1). A translator attends from --target, or else from its own greedy translation.

--model takes a run directory from `glassformer train`, a checkpoint directory, a
Hugging Face directory of a family `glassformer models` lists or BERT's (with its
tokenizer), a sentence-transformers directory, or a packaged model by name
(all-MiniLM-L6-v2, SmolLM2-135M-Instruct). With
several kinds, --out attention.png becomes attention-encoder.png, attention-decoder.png,
attention-cross.png.

For a Vision Transformer (`glassformer train vision`) TEXT is an image file: --out gets
the class token's attention per layer and head drawn over the image, and the attention
rollout across the layers (--resize scales an image of another size first).

--out view.html writes instead one self-contained page (no network needed) with every
kind of attention in it: the head view (a line per query and key, as opaque as its
weight), the model view (every layer × head) and the neuron view (the q·k products per
dimension that make a score); a mixture of experts adds the experts each token went to
(the experts tab). --which, --layer and --head are for images only. --vector FILE (a
probes file from `glassformer probe`) adds the directions tab: each token's projection on
the class difference of each probed hook, as a track for the best probe's hook (or
--vector-hook) and a grid of them all. For a ViT the page's tokens are its class token and
patches (r1c1 is the top-left patch).

Every picture is drawn from the hook points (``run_with_cache``): each layer's
``hook_pattern``, and for the page its queries and keys.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "draw attention heatmaps (per layer and head) for a text, or an interactive HTML page"
EXAMPLE = (
    'glassformer attention --model runs/demo-imdb "A moving, beautifully acted film." '
    "--out view.html"
)
KINDS = ("encoder", "decoder", "cross")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "text", help="the input text (a translator's source sentence; a ViT's image file)"
    )
    p.add_argument("--model", required=True, help="run, checkpoint or pretrained directory")
    p.add_argument("--target", help="a translator's target sentence (default: its translation)")
    p.add_argument("--which", choices=(*KINDS, "all"), default="all", help="kind of attention")
    p.add_argument("--layer", type=int, help="only this layer (from 1)")
    p.add_argument("--head", type=int, help="only this head (from 1)")
    p.add_argument(
        "--out",
        default="attention.png",
        help="the image file (.png, .svg, .pdf) or an interactive page (.html)",
    )
    p.add_argument("--vector", help="the page: a probes file whose directions it tracks")
    p.add_argument("--vector-hook", help="the hook whose track --vector opens on (default: best)")
    p.add_argument(
        "--resize", action="store_true", help="vision: scale the image to the model's size"
    )


def run(args: argparse.Namespace) -> int:
    from glassformer.inference import load_run
    from glassformer.viz.attention import attention_maps, plot_attention, save_figure

    out = Path(args.out)
    if out.suffix.lower() not in (".png", ".svg", ".pdf", ".html"):
        raise ValueError(f"--out {args.out}: expected a .png, .svg, .pdf or .html file name")
    if out.suffix.lower() == ".html":
        if args.which != "all" or args.layer is not None or args.head is not None:
            raise ValueError("--which, --layer and --head choose images; the page has them all")
        return _page(args, out)
    if args.vector or args.vector_hook:
        raise ValueError("--vector and --vector-hook are for the page: give --out NAME.html")
    model, tokenizer = load_run(args.model)
    if model.kind == "vit":
        return _image(args, model, tokenizer, out)
    if args.resize:
        raise ValueError("--resize is for a Vision Transformer's image; this model reads text")
    maps = attention_maps(model, tokenizer, args.text, target=args.target)
    if args.which != "all":
        maps = [m for m in maps if m.kind == args.which]
        if not maps:
            raise ValueError(f"a {model.kind!r} model has no {args.which} attention")
    figures = [(m, plot_attention(m, layer=args.layer, head=args.head)) for m in maps]
    for m, fig in figures:
        path = out if len(figures) == 1 else out.with_name(f"{out.stem}-{m.kind}{out.suffix}")
        save_figure(fig, path)
        layers, heads, tq, tk = m.weights.shape
        print(f"{path}: {m.title}, {layers} layers × {heads} heads, {tq} × {tk} tokens")
    return 0


def _image(args: argparse.Namespace, model, processor, out: Path) -> int:
    """The ViT's attention over the image file ``args.text``, saved to ``out``."""
    from glassformer.inference import read_labels
    from glassformer.viz.attention import save_figure
    from glassformer.viz.image_attention import image_attention, plot_image_attention

    given = {"--target": args.target, "--layer": args.layer, "--head": args.head}
    given["--which"] = None if args.which == "all" else args.which
    if any(v is not None for v in given.values()):
        names = ", ".join(k for k, v in given.items() if v is not None)
        raise ValueError(f"{names}: for text models; a ViT's figure has every layer and head")
    image = processor.open(args.text, resize=args.resize)
    att = image_attention(model, image, read_labels(args.model))
    save_figure(plot_image_attention(att), out)
    layers, heads = att.per_head.shape[:2]
    print(
        f"{out}: {att.label} ({att.probability:.3f}); where the {att.reader} looks, "
        f"{layers} layers × {heads} heads, and the rollout"
    )
    return 0


def _page(args: argparse.Namespace, out: Path) -> int:
    from glassformer.inference import load_run
    from glassformer.viz.viewer import attention_html, directions_page

    model, tokenizer = load_run(args.model)
    if args.vector_hook and not args.vector:
        raise ValueError("--vector-hook chooses among --vector's hooks: give --vector FILE")
    if args.vector:
        if args.target is not None or model.kind in ("vit", "seq2seq"):
            raise ValueError(f"--vector reads a one-stack text model; this is {model.kind!r}")
        view = directions_page(model, tokenizer, args.text, args.vector, args.vector_hook)
    else:
        title = f"{Path(args.model).name} ({model.kind})"
        view = attention_html(model, tokenizer, args.text, target=args.target, title=title)
    view.save(out)
    size = out.stat().st_size
    print(f"{out}: an attention viewer page ({size / 1e6:.2f} MB), open it in a browser")
    return 0
