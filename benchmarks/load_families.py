"""Opening a Hugging Face directory of each family: glassformer's ``from_pretrained`` next to
transformers' ``AutoModelFor…from_pretrained``, on the same files.

For each family a random model of a realistic shape (about 50 M parameters: width 512, 8
layers, a 32,000-token vocabulary; the translators 6 + 6 layers) is written once with
transformers' ``save_pretrained`` (safetensors). Each load then runs in a fresh Python
process, the two libraries alternating, ``--repeats`` times; the time is the load call alone
(imports apart), the memory the process's peak resident size during the load minus its size
just before (``ru_maxrss``, ``/proc/self/statm``). Medians are reported, and the ratios
transformers ÷ glassformer for time (> 1: glassformer faster) and glassformer ÷ transformers
for memory (the goal: at most 1.2).

    python benchmarks/load_families.py [--repeats 3] [--families qwen2,t5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import load_child  # benchmarks/_common.py

CHILD = load_child(
    imports="""kind, path, seq2seq = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if kind == "glassformer":
    from glassformer import GPT, Seq2SeqTransformer
else:
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM""",
    load="""if kind == "glassformer":
    model = (Seq2SeqTransformer if seq2seq else GPT).from_pretrained(path)
else:
    auto = AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM
    model = auto.from_pretrained(path, dtype=torch.float32)""",
)

DECODER = dict(vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
               num_attention_heads=8, max_position_embeddings=2048)  # fmt: skip


def configs() -> dict[str, tuple[str, dict, bool]]:
    """family → (transformers config class, its fields, seq2seq)."""
    gqa = dict(DECODER, num_key_value_heads=2)
    return {
        "llama": ("LlamaConfig", gqa, False),
        "mistral": ("MistralConfig", dict(gqa, sliding_window=1024), False),
        "qwen2": ("Qwen2Config", gqa, False),
        "qwen3": ("Qwen3Config", dict(gqa, head_dim=64), False),
        "gemma3": ("Gemma3TextConfig", dict(gqa, head_dim=64, query_pre_attn_scalar=64), False),
        "gpt_neox": ("GPTNeoXConfig", dict(DECODER, intermediate_size=2048), False),
        "gpt_neo": (
            "GPTNeoConfig",
            dict(
                vocab_size=32000,
                hidden_size=512,
                num_layers=8,
                num_heads=8,
                attention_types=[[["global", "local"], 4]],
                window_size=256,
            ),
            False,
        ),  # fmt: skip
        "gptj": (
            "GPTJConfig",
            dict(vocab_size=32000, n_embd=512, n_layer=8, n_head=8, rotary_dim=32),
            False,
        ),  # fmt: skip
        "olmo": ("OlmoConfig", dict(gqa, clip_qkv=8.0), False),
        "olmo2": ("Olmo2Config", gqa, False),
        "phi": ("PhiConfig", dict(DECODER, partial_rotary_factor=0.5), False),
        "phi3": ("Phi3Config", dict(gqa, partial_rotary_factor=0.75, pad_token_id=None), False),
        "mixtral": ("MixtralConfig", dict(gqa, num_local_experts=8, intermediate_size=768), False),
        "olmoe": (
            "OlmoeConfig",
            dict(gqa, num_experts=8, num_experts_per_tok=2, intermediate_size=768),
            False,
        ),  # fmt: skip
        "qwen2_moe": (
            "Qwen2MoeConfig",
            dict(
                gqa,
                num_experts=8,
                num_experts_per_tok=2,
                moe_intermediate_size=768,
                shared_expert_intermediate_size=1536,
            ),
            False,
        ),  # fmt: skip
        "opt": (
            "OPTConfig",
            dict(
                vocab_size=32000,
                hidden_size=512,
                ffn_dim=2048,
                num_hidden_layers=8,
                num_attention_heads=8,
                max_position_embeddings=2048,
            ),
            False,
        ),  # fmt: skip
        "marian": (
            "MarianConfig",
            dict(
                vocab_size=32000,
                d_model=512,
                encoder_layers=6,
                decoder_layers=6,
                encoder_ffn_dim=2048,
                decoder_ffn_dim=2048,
                pad_token_id=31999,
                decoder_start_token_id=31999,
            ),
            True,
        ),  # fmt: skip
        "t5": (
            "T5Config",
            dict(
                vocab_size=32000,
                d_model=512,
                d_kv=64,
                d_ff=2048,
                num_layers=6,
                num_heads=8,
                feed_forward_proj="gated-gelu",
                tie_word_embeddings=False,
            ),
            True,
        ),  # fmt: skip
    }


def write(family: str, root: Path) -> tuple[Path, bool]:
    import torch
    import transformers

    name, fields, seq2seq = configs()[family]
    config = getattr(transformers, name)(**fields)
    auto = transformers.AutoModelForSeq2SeqLM if seq2seq else transformers.AutoModelForCausalLM
    torch.manual_seed(0)
    model = auto.from_config(config)
    path = root / family
    model.save_pretrained(path)
    return path, seq2seq


def load(kind: str, path: Path, seq2seq: bool) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, kind, str(path), "1" if seq2seq else "0"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"{kind} could not load {path}:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--families", default=",".join(configs()))
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args()
    figures = {}
    with tempfile.TemporaryDirectory(prefix="families-") as tmp:
        print(f"{'family':<10} {'params':>7}  {'glassformer':>12} {'transformers':>13}  "
              f"{'time ratio':>10}  {'peak MiB g / t':>15}  {'memory ratio':>12}")  # fmt: skip
        for family in args.families.split(","):
            path, seq2seq = write(family, Path(tmp))
            runs: dict[str, list[dict[str, float]]] = {"glassformer": [], "transformers": []}
            for _ in range(args.repeats):
                for kind in runs:  # alternating: drift hits both alike
                    runs[kind].append(load(kind, path, seq2seq))
            med = {k: {key: statistics.median(r[key] for r in rows) for key in rows[0]}
                   for k, rows in runs.items()}  # fmt: skip
            g, t = med["glassformer"], med["transformers"]
            figures[family] = {"glassformer": g, "transformers": t,
                               "time_ratio": t["load_s"] / g["load_s"],
                               "memory_ratio": g["peak_mib"] / t["peak_mib"]}  # fmt: skip
            print(f"{family:<10} {g['params'] / 1e6:6.1f}M  {g['load_s']:10.3f} s "
                  f"{t['load_s']:11.3f} s  {t['load_s'] / g['load_s']:9.2f}x  "
                  f"{g['peak_mib']:6.0f} / {t['peak_mib']:<6.0f}  "
                  f"{g['peak_mib'] / t['peak_mib']:11.2f}x", flush=True)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
