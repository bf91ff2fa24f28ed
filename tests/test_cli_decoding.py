"""The decoding flags of generate, chat and translate come from GenerationConfig's fields."""

from __future__ import annotations

import dataclasses

import pytest

from glassformer.cli import build_parser
from glassformer.cli._decoding import field_docs, generation_config
from glassformer.cli.generate import SAMPLING
from glassformer.cli.translate import DECODING
from glassformer.generation import GenerationConfig


def _config(*argv: str) -> GenerationConfig:
    args = build_parser().parse_args(list(argv))
    return generation_config(args)[0]


def test_every_field_has_its_line_in_the_docstring():
    assert set(field_docs()) == {f.name for f in dataclasses.fields(GenerationConfig)}
    assert field_docs()["top_k"] == "sample among the top_k likeliest tokens only (None: all)"


def test_no_flags_give_each_commands_defaults():
    assert _config("translate", "x") == GenerationConfig()
    assert _config("generate") == GenerationConfig(do_sample=True, temperature=0.8)
    assert _config("chat") == GenerationConfig(do_sample=True, temperature=0.8)


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["translate", "x", "--sample"], "do_sample", True),
        (["generate", "--greedy"], "do_sample", False),
        (["chat", "--greedy"], "do_sample", False),
        (["generate", "--no-cache"], "use_cache", False),
        (["translate", "x", "--no-cache"], "use_cache", False),
        (["generate", "--compile"], "compile", True),
        (["generate", "--temperature", "0.5"], "temperature", 0.5),
        (["generate", "--top-k", "7"], "top_k", 7),
        (["generate", "--top-p", "0.9"], "top_p", 0.9),
        (["generate", "--repetition-penalty", "1.3"], "repetition_penalty", 1.3),
        (["translate", "x", "--beam", "4"], "beam_size", 4),
        (["translate", "x", "--length-penalty", "0.6"], "length_penalty", 0.6),
        (["translate", "x", "--sample", "--top-k", "3"], "top_k", 3),
    ],
)
def test_each_flag_reaches_its_field(argv, field, value):
    assert getattr(_config(*argv), field) == value


def test_every_offered_field_has_a_flag_tested():
    """A field added to a command's list is offered (and so must be listed above)."""
    assert set(SAMPLING) == {
        "do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "use_cache", "compile"
    }  # fmt: skip
    assert set(DECODING) == set(SAMPLING) - {"compile"} | {"beam_size", "length_penalty"}


def test_a_bad_value_is_refused_by_the_config():
    with pytest.raises(ValueError, match="beam_size"):
        _config("translate", "x", "--beam", "0")


def test_the_seed_makes_a_generator():
    args = build_parser().parse_args(["translate", "x", "--sample", "--seed", "3"])
    _, g = generation_config(args)
    assert g is not None and g.initial_seed() == 3
    assert generation_config(build_parser().parse_args(["generate"]))[1] is None
