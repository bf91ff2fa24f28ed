"""``GenerationConfig``: every decoding option in one typed, checked, frozen object.

The decoding functions (``gpt_generate``, ``seq2seq_generate``, ``beam_search``,
``choose_next``) and the models' ``generate`` take a config, the same options as
keywords, or both: keywords override the config's fields (``dataclasses.replace``), so

    model.generate(ids, 50, generation_config=GenerationConfig(do_sample=True, top_k=50))
    model.generate(ids, 50, do_sample=True, top_k=50)

decode alike. What belongs to one call (the prompt's ``attention_mask``, the
``torch.Generator``, a streamer) is an argument of its own, never a config field.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class GenerationConfig:
    """How the next token is chosen, and when decoding stops.

    Attributes:
        do_sample: draw the next token from the model's distribution (False: the arg-max).
        temperature: the logits are divided by it before sampling (< 1 sharper, > 1 flatter).
        top_k: sample among the ``top_k`` likeliest tokens only (None: all).
        top_p: sample among the smallest set of tokens whose probability reaches ``top_p``
            (nucleus sampling; None: all).
        repetition_penalty: > 1 makes tokens already in the sequence less likely (the CTRL
            rule; 1.0: off).
        eos_id: a stop token or several (GPT): a row that emits one is finished. The
            translator stops at its own config's ``eos_id`` and takes None here.
        beam_size: hypotheses kept by beam search (the translator); 1 decodes greedily or
            by sampling.
        length_penalty: finished beams score ``log p / length ** length_penalty``; 0
            compares raw log-probabilities, larger values favour longer output.
        early_stopping: a sentence's beam search ends once it has ``beam_size`` finished
            hypotheses (False: only when no live one can still beat them).
        use_cache: decode with the key/value cache; False reruns the whole sequence every
            step (the reference path, same tokens).
        static_cache: a GPT decodes with a cache allocated once for prompt + new tokens and
            a one-token step (``glassformer.generation.static``); False: the plain cached
            path, a cache that grows, through the model's forward (same tokens). Models
            that cannot (a sliding window, hooks attached, past ``max_len``) take the
            plain path.
        compile: ``torch.compile`` the static path's step (compiled on first use, once
            per model and batch shape): faster per token where measured so, after a
            compilation of tens of seconds.
        vocab_limit: ids from ``vocab_limit`` on are never chosen: the tokenizer's size,
            where the model's vocabulary is padded past it (Qwen2's and Pythia's
            embeddings, a GGUF file whose token list is shorter), so that every id decodes.
            None: every id of the model.

    ``temperature``, ``top_k`` and ``top_p`` are checked when ``do_sample`` is set, the
    only time they are used (greedy decoding with ``temperature=0`` is fine).
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0
    eos_id: int | tuple[int, ...] | None = None
    beam_size: int = 1
    length_penalty: float = 1.0
    early_stopping: bool = True
    use_cache: bool = True
    static_cache: bool = True
    compile: bool = False
    vocab_limit: int | None = None

    def __post_init__(self) -> None:
        for name in ("do_sample", "early_stopping", "use_cache", "static_cache", "compile"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.do_sample:
            _check_sampling(self.temperature, self.top_k, self.top_p)
        check_repetition_penalty(self.repetition_penalty)
        if not _is_int(self.beam_size) or self.beam_size < 1:
            raise ValueError(f"beam_size must be a positive integer, got {self.beam_size!r}")
        if self.beam_size > 1 and self.do_sample:
            raise ValueError("beam search does not sample: use beam_size=1 with do_sample")
        if self.vocab_limit is not None and (not _is_int(self.vocab_limit) or self.vocab_limit < 1):
            raise ValueError(f"vocab_limit must be a positive integer, got {self.vocab_limit!r}")
        if not math.isfinite(self.length_penalty):
            raise ValueError(f"length_penalty must be a finite number, got {self.length_penalty}")
        # A list of stop tokens is kept as a tuple: the config stays immutable and hashable.
        object.__setattr__(self, "eos_id", _stop_tokens(self.eos_id))


OPTIONS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(GenerationConfig))


def resolve_config(
    generation_config: GenerationConfig | None,
    options: Mapping[str, Any],
    call_arguments: Sequence[str] = (),
) -> GenerationConfig:
    """The config a call decodes with: ``generation_config`` (None: the defaults) with the
    keyword ``options`` replacing its fields.

    ``call_arguments`` are the caller's own keyword arguments, listed in the error for a
    keyword that is neither one of them nor a config field.
    """
    config = GenerationConfig() if generation_config is None else generation_config
    if not isinstance(config, GenerationConfig):
        raise TypeError(
            f"generation_config must be a GenerationConfig, got {type(config).__name__}"
        )
    unknown = [name for name in options if name not in OPTIONS]
    if unknown:
        known = ", ".join([*OPTIONS, *call_arguments])
        raise TypeError(f"unknown generation option {unknown[0]!r}; the options are: {known}")
    return dataclasses.replace(config, **options) if options else config


def check_repetition_penalty(penalty: float) -> None:
    if not penalty > 0 or math.isinf(penalty):  # also refuses NaN
        raise ValueError(f"repetition_penalty must be > 0, got {penalty}")


def _check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    if not temperature > 0 or math.isinf(temperature):  # also refuses NaN
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    if top_k is not None and (not _is_int(top_k) or top_k <= 0):
        raise ValueError(f"top_k must be a positive integer, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def _stop_tokens(eos_id: int | Sequence[int] | None) -> int | tuple[int, ...] | None:
    """``eos_id`` as given, a sequence of them as a tuple; refuses anything but token ids."""
    if eos_id is None:
        return None
    if isinstance(eos_id, int) and not isinstance(eos_id, bool) and eos_id >= 0:
        return eos_id
    if isinstance(eos_id, Sequence) and all(_is_int(t) and t >= 0 for t in eos_id):
        return tuple(eos_id)
    raise ValueError(
        f"eos_id must be a token id (an int >= 0), a sequence of them, or None; got {eos_id!r}"
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
