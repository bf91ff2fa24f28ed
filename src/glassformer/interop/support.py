"""Which model families glassformer opens, and what has been shown to work on each.

The matrix is written by the test run, not by hand: each family's tests record what they
proved (``tests/conftest.py``'s ``support`` fixture), and a run of the whole suite that
passes writes ``support.json`` beside this module. ``glassformer models`` prints it; the
documentation's families page is made from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SUPPORT_FILE = Path(__file__).with_name("support.json")

# (family, the Hugging Face model_type its config.json names, the glassformer model)
FAMILIES = (
    ("GPT-2", "gpt2", "GPT"),
    ("Llama", "llama", "GPT"),
    ("Mistral", "mistral", "GPT"),
    ("Qwen2", "qwen2", "GPT"),
    ("Qwen3", "qwen3", "GPT"),
    ("Gemma 2", "gemma2", "GPT"),
    ("Gemma 3", "gemma3_text", "GPT"),
    ("GPT-Neo", "gpt_neo", "GPT"),
    ("GPT-NeoX", "gpt_neox", "GPT"),
    ("GPT-J", "gptj", "GPT"),
    ("OLMo", "olmo", "GPT"),
    ("OLMo 2", "olmo2", "GPT"),
    ("OPT", "opt", "GPT"),
    ("Mixtral", "mixtral", "GPT"),
    ("OLMoE", "olmoe", "GPT"),
    ("Qwen2-MoE", "qwen2_moe", "GPT"),
    ("Phi", "phi", "GPT"),
    ("Phi-3", "phi3", "GPT"),
    ("MarianMT", "marian", "Seq2SeqTransformer"),
    ("T5", "t5", "Seq2SeqTransformer"),
)
CAPABILITIES = (
    "load",  # from_pretrained on a Hugging Face directory
    "logits",  # within 1e-4 of transformers
    "every activation",  # hidden states, attention weights, hooked modules within 1e-4
    "generate with cache",  # the same greedy tokens as transformers, cached and uncached
    "int8/int4",  # for_inference: close to fp32, and it generates
    "GGUF",  # the llama.cpp file of the family loads, equal to its dequantised weights
    "lens/patching/viewer",  # the logit lens, activation patching and the viewer run on it
)


def support_matrix() -> dict[str, dict[str, bool]]:
    """family → capability → shown by the tests (False: not shown, or not supported)."""
    recorded: dict[str, Any] = (
        json.loads(SUPPORT_FILE.read_text()) if SUPPORT_FILE.is_file() else {}
    )
    shown = recorded.get("families", {})
    return {
        family: {cap: bool(shown.get(family, {}).get(cap, False)) for cap in CAPABILITIES}
        for family, _, _ in FAMILIES
    }


def support_table(markdown: bool = False) -> str:
    """The matrix as text (``glassformer models``) or as a Markdown table (the docs)."""
    matrix = support_matrix()
    head = ["family", "model_type", "opens as", *CAPABILITIES]
    rows = [
        [family, model_type, cls, *("yes" if matrix[family][c] else "—" for c in CAPABILITIES)]
        for family, model_type, cls in FAMILIES
    ]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(f"`{r[1]}`" if i == 1 else r[i] for i in range(len(r))) + " |"
                  for r in rows]  # fmt: skip
        return "\n".join(lines)
    widths = [max(len(str(x)) for x in column) for column in zip(head, *rows, strict=True)]
    return "\n".join(
        "  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)).rstrip()
        for row in [head, *rows]
    )


def write_support(shown: dict[str, set[str]]) -> bool:
    """Write what a passing test run showed (family → capabilities) to ``SUPPORT_FILE``;
    True if the file changed."""
    unknown = set(shown) - {family for family, _, _ in FAMILIES}
    if unknown:
        raise ValueError(f"support recorded for unknown families {sorted(unknown)}")
    data = {
        "written by": "the test suite (tests/conftest.py); do not edit",
        "families": {
            family: {cap: cap in shown.get(family, set()) for cap in CAPABILITIES}
            for family, _, _ in FAMILIES
        },
    }
    text = json.dumps(data, indent=1) + "\n"
    if SUPPORT_FILE.is_file() and SUPPORT_FILE.read_text() == text:
        return False
    tmp = SUPPORT_FILE.with_suffix(".json.tmp")
    tmp.write_text(text)
    tmp.replace(SUPPORT_FILE)
    return True
