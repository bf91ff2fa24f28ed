"""Rotary scaling: RoPE's frequencies stretched to read past the context a model trained on.

RoPE turns feature pair i of a vector at position p by the angle p·θ_i, with
θ_i = base^(−2i/d) (``modules.rotary``). A model trained on contexts of L tokens has seen
its slow pairs (wavelength 2π/θ_i longer than L) turn only part of the way round. Released
checkpoints that read further scale θ_i, each family its own way (Hugging Face's
``rope_type``; s is the ``factor``):

    linear    θ_i / s: every pair turns s times slower (positions interpolated)
    dynamic   the base grows with the length T read: base·(s·T/L − (s − 1))^(d/(d−2)) once
              T > L (NTK-aware); plain RoPE up to L
    llama3    pairs slower than L/low_freq_factor tokens a turn: θ_i / s; faster than
              L/high_freq_factor: kept; in between, a blend by where the wavelength falls
    yarn      a ramp over the pairs: the fast ones kept, the slow ones θ_i / s, a linear
              blend between (bounded by how many turns a pair makes in L: beta_fast,
              beta_slow); and cos, sin × (0.1·ln s + 1), sharpening the attention
    longrope  θ_i / f_i with a factor per pair: the short factors up to L, the long ones
              past it (Phi-3); cos, sin × √(1 + ln s / ln L)
    factors   θ_i / f_i with fixed factors per pair: the ``rope_freqs`` tensor in which
              llama.cpp's converter writes a Llama 3.x's llama3 rule

``dynamic`` and ``longrope`` depend on the length read, the longest position of the call
plus one. (Hugging Face keeps the longest length seen so far between calls; here each call
stands alone, which is the same whenever positions grow, as in decoding.)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

# What each rule reads besides the factor (the rest must be left at their defaults).
KINDS = ("linear", "dynamic", "llama3", "yarn", "longrope", "factors")


@dataclass(frozen=True)
class RopeScaling:
    """One rotary scaling rule and its numbers, as a config states them.

    Attributes:
        rope_type: "linear", "dynamic", "llama3", "yarn", "longrope" or "factors".
        factor: s, how many times longer the context read than the one trained on.
        original_max_len: L, the context trained on (``original_max_position_embeddings``).
        max_len: the model's longest context (``max_position_embeddings``): dynamic's L, and
            longrope's s (max_len / L) when no factor is given.
        low_freq_factor, high_freq_factor: llama3's band (1 and 4 in Llama 3.1).
        beta_fast, beta_slow: yarn's ramp, in turns within L (32 and 1 by default).
        mscale, mscale_all_dim: yarn's temperature terms (DeepSeek's); None: 0.1·ln s + 1.
        attention_factor: the factor on cos and sin, where a config states it (yarn,
            longrope); None: from s.
        truncate: yarn rounds the ramp's ends outward to whole pairs.
        short_factor, long_factor: longrope's per-pair factors, d/2 each.
        factors: the fixed per-pair factors of "factors" (llama.cpp's ``rope_freqs``).
    """

    rope_type: str
    factor: float | None = None
    original_max_len: int | None = None
    max_len: int | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    factors: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.rope_type not in KINDS:
            raise ValueError(f"rope_type must be one of {list(KINDS)}, got {self.rope_type!r}")
        for name in ("short_factor", "long_factor", "factors"):
            factors = getattr(self, name)
            if not isinstance(factors, (list, tuple)) or not all(map(_positive, factors)):
                raise ValueError(f"{name} must be a list of numbers > 0, got {factors!r}")
            object.__setattr__(self, name, tuple(float(f) for f in factors))
        numbers = ("low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow")
        optional = ("mscale", "mscale_all_dim", "attention_factor")
        for name in numbers + optional:
            value = getattr(self, name)
            if not (_positive(value) or (value is None and name in optional)):
                raise ValueError(f"{name} must be a number > 0, got {value!r}")
        if not isinstance(self.truncate, bool):
            raise ValueError(f"truncate must be true or false, got {self.truncate!r}")
        if self.rope_type not in ("longrope", "factors") and not _positive(self.factor):
            raise ValueError(f"{self.rope_type} scaling needs a factor > 0, got {self.factor!r}")
        needs_l = self.rope_type in ("llama3", "yarn", "longrope")
        if needs_l and not (_whole(self.original_max_len)):
            raise ValueError(
                f"{self.rope_type} scaling needs original_max_len, a positive integer; "
                f"got {self.original_max_len!r}"
            )
        if self.rope_type == "dynamic" and not _whole(self.max_len):
            raise ValueError(f"dynamic scaling needs max_len, got {self.max_len!r}")
        if self.rope_type == "llama3" and not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError(
                "llama3 scaling needs 0 < low_freq_factor < high_freq_factor, got "
                f"{self.low_freq_factor} and {self.high_freq_factor}"
            )
        if self.rope_type == "longrope" and not (self.short_factor and self.long_factor):
            raise ValueError("longrope scaling needs short_factor and long_factor")
        if self.rope_type == "factors" and not self.factors:
            raise ValueError("factors scaling needs its factors, one per rotated pair")

    def check(self, base: float, dim: int) -> None:
        """That this rule turns ``dim`` features with ``base`` into finite frequencies (one
        error naming the rule, not a ZeroDivisionError when the model is built)."""
        try:
            for length in (None, torch.tensor(4 * (self.max_len or self.original_max_len or 1))):
                theta, factor = frequencies(self, base, dim, length)
                if not (bool(torch.isfinite(theta).all()) and math.isfinite(factor)):
                    raise ValueError("frequencies that are not finite numbers")
        except (ArithmeticError, ValueError) as e:
            problem = f"{self.rope_type} scaling with base {base} on {dim} features: {e}"
            raise ValueError(problem) from None

    @property
    def varies(self) -> bool:
        """Whether the frequencies depend on the length read (dynamic, longrope)."""
        return self.rope_type in ("dynamic", "longrope")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RopeScaling:
        """A saved rule back (``dataclasses.asdict``'s dict), refusing a field it lacks."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"RopeScaling has no field(s) {unknown}; known: {sorted(known)}")
        return cls(**values)


def frequencies(
    scaling: RopeScaling, base: float, dim: int, length: Tensor | None = None
) -> tuple[Tensor, float]:
    """(θ_i scaled, (dim/2,) float32; the factor on cos and sin) for rotating ``dim``
    features with ``base``; ``length`` (a 0-d tensor, the positions read) for the rules that
    vary with it (None: the context trained on)."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim  # 2i/d
    return RULES[scaling.rope_type](scaling, base, exponents, length)


def _linear(s: RopeScaling, base: float, exponents: Tensor, length: Tensor | None):
    return 1.0 / base**exponents / _factor(s), 1.0


def _dynamic(s: RopeScaling, base: float, exponents: Tensor, length: Tensor | None):
    assert s.max_len is not None  # checked when made
    L, factor, dim = float(s.max_len), _factor(s), 2 * len(exponents)
    T = torch.tensor(L) if length is None else torch.clamp(length.float(), min=L)
    grown = base * ((factor * T / L) - (factor - 1)) ** (dim / (dim - 2))
    return 1.0 / grown**exponents, 1.0


def _llama3(s: RopeScaling, base: float, exponents: Tensor, length: Tensor | None):
    theta = 1.0 / base**exponents
    L, factor = float(_trained(s)), _factor(s)
    wavelength = 2 * math.pi / theta
    slow = wavelength > L / s.low_freq_factor  # turn less than low_freq_factor times in L
    fast = wavelength < L / s.high_freq_factor
    blend = (L / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    between = (1 - blend) * theta / factor + blend * theta
    return torch.where(slow, theta / factor, torch.where(fast, theta, between)), 1.0


def _yarn(s: RopeScaling, base: float, exponents: Tensor, length: Tensor | None):
    factor, L, half = _factor(s), _trained(s), len(exponents)
    dim = 2 * half

    def pair_turning(turns: float) -> float:  # the pair that makes ``turns`` turns in L
        return dim * math.log(L / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_turning(s.beta_fast), pair_turning(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = torch.clamp(
        (torch.arange(half, dtype=torch.float32) - low) / ((high - low) or 1e-3), 0, 1
    )
    powers = base**exponents
    kept = 1 - ramp  # the fast pairs (small i) keep θ_i, the slow ones are interpolated
    theta = (1.0 / (factor * powers)) * (1 - kept) + (1.0 / powers) * kept
    return theta, _yarn_temperature(s, factor)


def _yarn_temperature(s: RopeScaling, factor: float) -> float:
    if s.attention_factor is not None:
        return s.attention_factor

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if s.mscale and s.mscale_all_dim:
        return mscale(factor, s.mscale) / mscale(factor, s.mscale_all_dim)
    return mscale(factor)


def _longrope(s: RopeScaling, base: float, exponents: Tensor, length: Tensor | None):
    L = _trained(s)
    factor = s.factor if s.factor is not None else (s.max_len or L) / L
    temperature = s.attention_factor
    if temperature is None:
        temperature = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(L))
    for name in ("short_factor", "long_factor"):
        if len(getattr(s, name)) != len(exponents):
            raise ValueError(
                f"longrope's {name} has {len(getattr(s, name))} factors; the rotated "
                f"width {2 * len(exponents)} needs {len(exponents)}"
            )
    short = 1.0 / (torch.tensor(s.short_factor) * base**exponents)
    if length is None:
        return short, temperature
    long = 1.0 / (torch.tensor(s.long_factor) * base**exponents)
    return torch.where(length > L, long, short), temperature


def _fixed_factors(s: RopeScaling, base: float, exponents: Tensor, length: Tensor | None):
    if len(s.factors) != len(exponents):
        raise ValueError(
            f"rope factors: {len(s.factors)} given; the rotated width {2 * len(exponents)} "
            f"needs {len(exponents)}"
        )
    return 1.0 / (torch.tensor(s.factors) * base**exponents), 1.0


def _factor(s: RopeScaling) -> float:
    assert s.factor is not None  # checked when made
    return float(s.factor)


def _trained(s: RopeScaling) -> int:
    assert s.original_max_len is not None  # checked when made
    return s.original_max_len


def _positive(x: Any) -> bool:
    ok = isinstance(x, (int, float)) and not isinstance(x, bool)
    return ok and math.isfinite(x) and x > 0


def _whole(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


Rule = Callable[[RopeScaling, float, Tensor, "Tensor | None"], tuple[Tensor, float]]
RULES: dict[str, Rule] = {
    "linear": _linear,
    "dynamic": _dynamic,
    "llama3": _llama3,
    "yarn": _yarn,
    "longrope": _longrope,
    "factors": _fixed_factors,
}
