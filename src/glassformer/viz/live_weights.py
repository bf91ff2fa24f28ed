"""How the live page carries its weights: float32, the most bits of each that fit the page.

Every weight the page's rules read goes into one run of float32 values. Where the page would
be over ``LIVE_MAX_BYTES``, each value is rounded to fewer of float32's 23 mantissa bits
(``BITS``): the most that fit, and no fewer than keep every step within ``ROUNDED_BOUND`` of
the model's value on the calibration inputs, each step then stating four times its measured
error. The values are laid out byte plane by byte plane (every value's first byte, then every
second byte, ...), so that the rounded-off bits are runs of zeros and the sign and exponent
bytes repeat, deflated, and written as base85 text (5 characters for 4 bytes, where base64
takes 5⅓). The page inflates them once when it opens (``DecompressionStream``).
"""

from __future__ import annotations

import base64
import zlib
from typing import Any

import numpy as np
import torch
from torch import Tensor

from glassformer.errors import LiveError
from glassformer.models.base import PretrainedModel
from glassformer.viz.explain import relative_error

BITS = (23, 20, 18, 16, 14, 12, 10)  # mantissa bits kept: float32's all, then fewer
ROUNDED_BOUND = 0.0025  # rounded weights: no step moved by more than 0.25% of its largest
# value on the calibration inputs; the page states four times the measured error (≤ 1%)
SEEDED = (8, 24, 48)  # the lengths of the seeded texts calibration adds to the given ones
# Python's base85 alphabet with the three characters a page's JSON would escape (<, >, &)
# swapped for three it never uses; html/live-forward.js reads this alphabet
_B85_SAFE = bytes.maketrans(b"<>&", b".,:")


def rounded(w: Tensor, bits: int) -> Tensor:
    """``w`` as float32 with its mantissa rounded (to nearest) to ``bits`` of its 23 bits."""
    x = w.detach().float().contiguous().view(torch.int32)
    drop = 23 - bits
    if drop:
        x = ((x + (1 << (drop - 1))) >> drop) << drop
    return x.view(torch.float32)


def packed(weights: dict[str, Tensor], bits: int) -> dict[str, Any]:
    """The page's weights: each tensor's name, shape and offset in one run of float32 values
    rounded to ``bits``; the run's bytes by plane, deflated, as base85 (``length``: the
    deflated bytes before padding to a multiple of four)."""
    tensors, parts, offset = [], [], 0
    for name, w in weights.items():
        tensors.append({"name": name, "shape": list(w.shape), "offset": offset})
        parts.append(rounded(w, bits).flatten().numpy().astype("<f4"))
        offset += w.numel()
    values = np.concatenate(parts) if parts else np.zeros(0, "<f4")
    planes = values.view(np.uint8).reshape(-1, 4).T.tobytes()
    deflated = zlib.compress(planes, 6)
    text = base64.b85encode(deflated + bytes(-len(deflated) % 4)).translate(_B85_SAFE)
    return {"bits": bits, "tensors": tensors, "length": len(deflated), "values": text.decode()}


def carried(
    model: PretrainedModel,
    steps: list[dict],
    rules: list[dict],
    weights: dict[str, Tensor],
    tables: dict,
    budget: int,
    inputs: list[Any],
) -> tuple[dict[str, Any], list[float] | None, str | None]:
    """(the packed weights, each step's stated bound or None for float32's every bit, why
    the page is over ``budget`` characters of weights where it is). The most bits whose
    packing fits ``budget``; fewer bits than that only where they keep every step within
    ``ROUNDED_BOUND`` on ``inputs`` and seeded ones, else more bits until they do."""
    sizes = {}
    for bits in BITS:
        sizes[bits] = packed(weights, bits)
        if len(sizes[bits]["values"]) <= budget:
            break
    fits = bits
    if fits == 23:
        return sizes[23], None, None
    calibration, why = _calibration(model, steps, inputs), None
    for bits in sorted(b for b in BITS if b >= fits):
        if bits == 23:
            break
        worst = _errors(rules, weights, tables, bits, calibration)
        if max(worst) <= ROUNDED_BOUND:
            bounds = [float(f"{max(4 * w, 1e-4):.2g}") for w in worst]
            over = None if bits == fits else f"{bits} bits, as fewer would move a step by more"
            return sizes.get(bits) or packed(weights, bits), bounds, over
        error, name = max(zip(worst, (s["name"] for s in steps), strict=True))
        why = (f"weights rounded to {bits} mantissa bits move {name} by {error:.2%} of its "
               f"largest value, more than {ROUNDED_BOUND:.2%}")  # fmt: skip
    return sizes.get(23) or packed(weights, 23), None, why


def _calibration(
    model: PretrainedModel, steps: list[dict], inputs: list[Any]
) -> list[tuple[Any, list[Tensor]]]:
    """The calibration inputs (``inputs``, then seeded texts of the ``SEEDED`` lengths or
    seeded images) with the model's value at each step."""
    from glassformer.viz.live_rules import page_values

    g = torch.Generator().manual_seed(0)
    low = 4 if getattr(model.config, "pad_id", None) is not None else 0
    inputs = list(inputs)
    for length in SEEDED:
        if model.kind == "vit":  # seeded images of the model's size, pixels 0..1
            c = model.config
            inputs.append(torch.rand(c.channels, *c.image_size, generator=g))
        elif model.kind == "seq2seq":  # a seeded source and target (from BOS)
            c, size = model.config, (min(length, model.config.max_len - 1),)
            target = torch.randint(low, c.tgt_vocab_size, size, generator=g)
            inputs.append({"source": torch.randint(low, c.src_vocab_size, size, generator=g),
                           "target": torch.cat([torch.tensor([c.bos_id]), target])})  # fmt: skip
        else:
            size = (min(length, model.config.max_len),)
            inputs.append(torch.randint(low, model.config.vocab_size, size, generator=g))
    names = [s["name"] for s in steps]
    return [(ids, page_values(model, names, ids)) for ids in inputs]


def _errors(
    rules: list[dict],
    weights: dict[str, Tensor],
    tables: dict,
    bits: int,
    calibration: list[tuple[Any, list[Tensor]]],
) -> list[float]:
    """Each step's largest difference from the model's value, relative to the step's
    largest magnitude, over ``calibration``, with the weights rounded to ``bits``."""
    from glassformer.viz.live_rules import run_rule

    weights = {name: rounded(w, bits).double() for name, w in weights.items()}
    worst = [0.0] * len(rules)
    for ids, expected in calibration:
        found: list[Tensor] = []
        for i, rule in enumerate(rules):
            value = run_rule(rule, found, weights, ids, tables)
            if value is None:
                raise LiveError(f"rounded weights leave no value for step {i}")
            found.append(value)
            worst[i] = max(worst[i], relative_error(value, expected[i]))
    return worst
