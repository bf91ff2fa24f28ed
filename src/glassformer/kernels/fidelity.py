"""Does a cheaper precision still say what the model says? Measured, not assumed.

Speed alone must not choose a precision: on a 2-core AMD EPYC, where bf16 products run
2.2x fp32's, ``--dtype auto`` once chose a model cast wholly to bf16, and SmolLM2 answered the
capital of France with "L'Étoile, la Marseillaise, ...". So ``auto`` also compares the
candidate's next-token distributions with fp32's on the model itself, over a fixed text
(``fidelity_texts.CALIBRATION``, a few hundred positions), and keeps fp32 unless both

- the **top-1 agreement** (the share of positions whose most likely token is the same) is at
  least ``MIN_TOP1``, and
- the **mean KL divergence** KL(p_fp32 ‖ p_candidate), in nats per position, is at most
  ``MAX_KL``.

    >>> f = compare(reference_logits, candidate_logits)          # doctest: +SKIP
    >>> f.top1, f.kl, f.positions, f.within_bound                # doctest: +SKIP
    (0.9939, 0.00016, 328, True)

A figure is cached in ``fidelity.json`` under the cache folder, keyed by the processor, torch's
version, a fingerprint of the model's weights and a digest of the inputs, since it depends on
all four and on nothing else.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from glassformer.cache import cache_root
from glassformer.fidelity_texts import CALIBRATION
from glassformer.kernels.precision_cache import processor, read_cache, write_cache

CACHE_FILE = "fidelity.json"
# The bound, on the held-out text as on the calibration one. bf16 products with the rest in
# fp32 measured 99.4% / 0.00016 nats on SmolLM2 (calibration), 99.7% / 0.00018 (held out);
# the model cast wholly to bf16 96.7% / 0.00083: its answers changed.
MIN_TOP1 = 0.99
MAX_KL = 0.01
WINDOW = 256  # tokens per calibration window (or the model's context, if shorter)
POSITIONS = 512  # calibration positions at most: a few hundred is enough to see a change
# Model kinds whose output is a distribution over tokens or classes, and how the calibration
# text goes in: as the input, or as the translator's source and its teacher-forced target.
TEXT_KINDS = ("gpt", "encoder_lm", "classifier", "gpt_classifier", "bert_classifier")
PAIR_KINDS = ("seq2seq",)


@dataclass(frozen=True)
class Fidelity:
    """A candidate precision's next-token distributions against fp32's: the share of
    positions whose top-1 token agrees, the mean KL(fp32 ‖ candidate) in nats, over how many
    positions, and whether it came from the cache."""

    top1: float
    kl: float
    positions: int
    cached: bool = False

    @property
    def within_bound(self) -> bool:
        return self.top1 >= MIN_TOP1 and self.kl <= MAX_KL

    def describe(self) -> str:
        bound = "within" if self.within_bound else "outside"
        return (
            f"top-1 agreement {self.top1:.1%}, mean KL {self.kl:.2g} nats over "
            f"{self.positions} positions: {bound} the bound (≥ {MIN_TOP1:.0%}, ≤ {MAX_KL} nats)"
        )


def compare(reference: Tensor, candidate: Tensor) -> Fidelity:
    """``candidate``'s logits against ``reference``'s, both (..., V): one distribution per
    position over the last dimension."""
    if reference.shape != candidate.shape:
        raise ValueError(
            f"logits of shapes {tuple(reference.shape)} and {tuple(candidate.shape)} differ"
        )
    p = F.log_softmax(reference.float(), dim=-1).flatten(0, -2)  # (N, V)
    q = F.log_softmax(candidate.float(), dim=-1).flatten(0, -2)
    kl = (p.exp() * (p - q)).sum(-1)  # (N,): KL(p ‖ q) per position
    agree = p.argmax(-1) == q.argmax(-1)
    return Fidelity(top1=agree.float().mean().item(), kl=kl.mean().item(), positions=len(kl))


def output_logits(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    """``model(*inputs)``'s logits (its output's ``logits``, or the output itself), in fp32."""
    with torch.inference_mode():
        out = model(*inputs)
    return getattr(out, "logits", out).float()


def calibration_inputs(
    model: nn.Module, tokenizer: Any, text: str = CALIBRATION
) -> tuple[Tensor, ...] | None:
    """``text`` as ``model``'s inputs, cut into equal windows no longer than its context (at
    most ``POSITIONS`` tokens in all), on the model's device; None for a kind whose output is no
    distribution or whose input is no text (a sentence encoder, a ViT)."""
    kind = getattr(model, "kind", None)
    if tokenizer is None or kind not in TEXT_KINDS + PAIR_KINDS:
        return None
    config = model.config
    context = min(WINDOW, int(getattr(config, "max_len", WINDOW)) - 1)
    ids = tokenizer.encode(text)[:POSITIONS]
    if not ids:
        return None
    count = -(-len(ids) // context)  # windows needed; then all of one length, as the text allows
    window = len(ids) // count
    rows = [ids[i * window : (i + 1) * window] for i in range(count)]
    device = next(model.parameters()).device
    batch = torch.tensor(rows, device=device)  # (B, window): equal lengths, no padding
    return (batch,) if kind in TEXT_KINDS else (batch, batch)


def fingerprint(model: nn.Module, inputs: tuple[Tensor, ...]) -> str:
    """A digest of ``model``'s weights (every tensor's name, shape and a strided sample of its
    values) and of ``inputs``: what a fidelity figure depends on."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        flat = t.detach().reshape(-1)
        step = max(1, flat.numel() // 4096)
        sample = flat[::step].float().cpu().contiguous()
        h.update(f"{name} {tuple(t.shape)} {t.dtype}".encode())
        h.update(sample.numpy().tobytes())
    for t in inputs:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:32]


def cached_fidelity(key: str, cache_dir: str | Path | None = None) -> Fidelity | None:
    entry: Any = read_cache(cache_root(cache_dir) / CACHE_FILE).get(_machine_key(key))
    try:
        return Fidelity(
            top1=float(entry["top1"]),
            kl=float(entry["kl"]),
            positions=int(entry["positions"]),
            cached=True,
        )
    except (TypeError, KeyError, ValueError):  # none, or unreadable: measure again
        return None


def remember(key: str, fidelity: Fidelity, cache_dir: str | Path | None = None) -> None:
    path = cache_root(cache_dir) / CACHE_FILE
    data = read_cache(path)
    entry = {k: v for k, v in asdict(fidelity).items() if k != "cached"}
    data[_machine_key(key)] = {**entry, "measured_at": round(time.time())}
    write_cache(path, data)


def _machine_key(key: str) -> str:
    return f"{processor()}; torch {torch.__version__}; {key}"
