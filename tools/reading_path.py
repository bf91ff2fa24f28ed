"""Which of glassformer's source files a forward pass runs, and how many lines a reader faces.

    python tools/reading_path.py                 # the readable GPT forward: GPT-2's shape, fp32
    python tools/reading_path.py --path gguf     # one decode step computing from SmolLM2's GGUF
    python tools/reading_path.py --path all --json

The forward is run once untraced (so that lazy imports and one-time set-up are done), then
once under ``sys.setprofile``, which sees every Python function call. Each file under
``src/glassformer`` holding a function that ran is on the path; a file is counted whole, as
it stands (docstrings, comments and blank lines included), because that is what a reader
opens. ``--lines`` lists the files with their lengths.

The figures are what issue 44 set goals for (the GPT forward in at most 8 files and 1,600
lines, with no line about GGUF, int8 or C; the GGUF decode step in at most 12 files).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import torch

import glassformer

PACKAGE = Path(glassformer.__file__).resolve().parent
# A line about a backend: GGUF, int8/int4, quantised or dequantised weights, C and ctypes.
BACKEND_WORDS = re.compile(r"gguf|int[48]|quanti[sz]|ctypes|\bC (?:library|kernel|code)", re.I)


def files_run(step: Callable[[], Any]) -> list[Path]:
    """The package's source files holding a Python function that ``step()`` called."""
    step()  # lazy imports, caches and one-time set-up are not the reading path
    seen: set[str] = set()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            seen.add(frame.f_code.co_filename)

    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    inside = [Path(name).resolve() for name in seen if name.endswith(".py")]
    return sorted(path for path in inside if path.is_relative_to(PACKAGE))


def gpt_forward() -> Callable[[], Any]:
    """GPT-2 small's shape (the ``base`` preset, 50,257 tokens), fp32, eval, no cache."""
    from glassformer import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("base", vocab_size=50257, dropout=0.0)).eval()
    ids = torch.randint(0, 50257, (1, 16))

    def step() -> Any:
        with torch.no_grad():
            return model(ids)

    return step


def gguf_decode_step() -> Callable[[], Any]:
    """One cached decode step of SmolLM2-135M-Instruct computing from its GGUF's blocks."""
    from glassformer import GPT
    from glassformer.interop.gguf import smollm2_path

    model = GPT.from_pretrained(str(smollm2_path())).for_inference("gguf")
    prompt = torch.tensor([[1, 2, 3, 4]])
    state: dict[str, Any] = {}

    def step() -> Any:
        with torch.no_grad():
            cache = model.new_cache()
            model(prompt, cache=cache)
            state["cache"] = cache
            return model(prompt[:, -1:], cache=cache)

    return step


PATHS = {"gpt": gpt_forward, "gguf": gguf_decode_step}


def report(name: str) -> dict[str, Any]:
    files = files_run(PATHS[name]())
    rows = []
    for path in files:
        text = path.read_text()
        rows.append(
            {
                "file": str(path.relative_to(PACKAGE.parent)),
                "lines": len(text.splitlines()),
                "backend_lines": sum(
                    bool(BACKEND_WORDS.search(line)) for line in text.splitlines()
                ),
            }
        )
    return {
        "path": name,
        "files": len(rows),
        "lines": sum(row["lines"] for row in rows),
        "backend_lines": sum(row["backend_lines"] for row in rows),
        "by_file": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", choices=[*PATHS, "all"], default="gpt")
    parser.add_argument("--lines", action="store_true", help="list each file and its length")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    reports = [report(name) for name in (PATHS if args.path == "all" else [args.path])]
    if args.json:
        print(json.dumps(reports, indent=2))
        return 0
    for result in reports:
        print(
            f"{result['path']}: {result['files']} files, {result['lines']} lines, "
            f"{result['backend_lines']} lines naming GGUF, int8/int4 or C"
        )
        if args.lines:
            for row in result["by_file"]:
                note = f"  ({row['backend_lines']} backend)" if row["backend_lines"] else ""
                print(f"  {row['lines']:5d}  {row['file']}{note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
