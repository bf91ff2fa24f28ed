"""Screenshots of the attention viewer for the README: docs/images/attention-viewer-*.png.

    python docs/screenshots.py [translator minilm gpt] [--translator RUN_DIR] [--out docs/images]

Three pages, each opened in Chromium (Playwright, /usr/bin/chromium or $GLASSFORMER_CHROMIUM)
from disk with the network cut, and photographed in one view:

    translator  the cross-attention head view (its sharpest head) of a translator trained
                for 10 minutes on bible-en-es (or the run --translator names)
    minilm      the model view of all-MiniLM-L6-v2 (6 layers × 12 heads)
    gpt         the neuron view of SmolLM2-135M-Instruct (rotary, grouped-query attention)

Any console error or network request stops the script.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from glassformer.cli.attention import load_model_and_tokenizer
from glassformer.viz import attention_html, attention_maps

PAGES = {
    # name: (model, text, target, [(action, selector, value)])
    "translator": (
        None,
        "In the beginning God created the heaven and the earth.",
        "En el principio creó Dios los cielos y la tierra.",
        [("select", "#kind", "2"), ("sharpest", "cross", None)],
    ),
    "minilm": (
        "all-MiniLM-L6-v2",
        "The cat sat on the mat because it was warm.",
        None,
        [("click", "button[data-view=model]", None)],
    ),
    "gpt": (
        "SmolLM2-135M-Instruct",
        "The capital of France is Paris, and the capital of Spain is",
        None,
        [
            ("click", "button[data-view=neuron]", None),
            ("select", "#layer", "12"),
            ("select", "#head", "4"),
        ],
    ),
}


def train_translator(folder: Path) -> Path:
    argv = ["train", "translate", "--corpus", "bible-en-es", "--preset", "tiny"]
    argv += ["--minutes", "10", "--no-test", "--out", str(folder)]
    subprocess.run([sys.executable, "-m", "glassformer", *argv], check=True)
    return folder


def sharpest(model, tokenizer, text, target, kind):
    """Select the layer and head of ``kind`` whose queries look at one key the most (the
    largest mean over queries of the top weight)."""
    maps = next(m for m in attention_maps(model, tokenizer, text, target=target) if m.kind == kind)
    score = maps.weights.max(-1).values.mean(-1)  # (L, H)
    layer, head = divmod(int(score.argmax()), score.size(1))
    return [("select", "#layer", str(layer + 1)), ("select", "#head", str(head + 1))]


def shoot(browser, page_file: Path, actions, shot: Path) -> Path:
    """Open ``page_file`` with the network refused, do ``actions``, save a screenshot."""
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    problems: list[str] = []

    def route(r):
        if r.request.url.startswith(("file:", "data:", "blob:")):
            r.continue_()
        else:
            problems.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda m: m.type == "error" and problems.append(m.text))
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto(page_file.resolve().as_uri())
    page.wait_for_selector("body[data-ready='1']")
    for action, selector, value in actions:
        if action == "click":
            page.click(selector)
        else:
            page.select_option(selector, value=value)
    if problems:
        raise SystemExit(f"{page_file.name}: {problems}")
    page.screenshot(path=str(shot))
    context.close()
    return shot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help=f"some of {', '.join(PAGES)} (default: all)")
    parser.add_argument("--translator", help="a translator's run directory")
    parser.add_argument("--out", default=str(Path(__file__).parent / "images"))
    args = parser.parse_args()
    if unknown := set(args.names) - set(PAGES):
        parser.error(f"no page named {', '.join(sorted(unknown))}; choose from {', '.join(PAGES)}")
    from playwright.sync_api import sync_playwright

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chromium = os.environ.get("GLASSFORMER_CHROMIUM") or shutil.which("chromium")
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        for name, (model_name, text, target, actions) in PAGES.items():
            if args.names and name not in args.names:
                continue
            if model_name is None:
                model_name = args.translator or str(train_translator(Path(tmp) / "translator"))
            model, tokenizer = load_model_and_tokenizer(model_name)
            title = f"{Path(model_name).name} ({model.kind})"
            if name == "translator":
                title = "a translator (seq2seq, tiny preset, 10 minutes on bible-en-es)"
            page_file = attention_html(model, tokenizer, text, target=target, title=title).save(
                Path(tmp) / f"{name}.html"
            )
            actions = [
                a if a[0] != "sharpest" else sharpest(model, tokenizer, text, target, a[1])
                for a in actions
            ]
            actions = [step for a in actions for step in (a if isinstance(a, list) else [a])]
            shot = shoot(browser, page_file, actions, out / f"attention-viewer-{name}.png")
            print(f"{shot}: {model_name}, {page_file.stat().st_size / 1e6:.2f} MB page")
        browser.close()


if __name__ == "__main__":
    main()
