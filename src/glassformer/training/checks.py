"""The rules a ``RunConfig`` is checked against when it is built: each field's own (its
``Rule``, beside the field; its choices, from its ``Literal`` type) and those between
fields. A value no run could use is one ``RunConfigError`` naming the field."""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from glassformer.errors import RunConfigError, one_line, shown

if TYPE_CHECKING:
    from glassformer.training.config import RunConfig


def on_off_auto(text: str) -> bool | str:
    """--bf16's value: on/off (also true/false, yes/no, 1/0) or auto."""
    words: dict[str, bool | str] = {"on": True, "true": True, "yes": True, "1": True}
    words |= {"off": False, "false": False, "no": False, "0": False, "auto": "auto"}
    if text.lower() not in words:
        raise argparse.ArgumentTypeError(f"expected auto, on or off, got {shown(text)}")
    return words[text.lower()]


@dataclass(frozen=True)
class Rule:
    """What a numeric field's value must be, said in words and tested by ``ok`` (a field
    whose words say "integer" takes integers only)."""

    expected: str
    ok: Callable[[Any], bool]


POSITIVE_INT = Rule("a positive integer", lambda v: v > 0)
POSITIVE = Rule("> 0", lambda v: v > 0)
NOT_NEGATIVE = Rule("0 or more", lambda v: v >= 0)
EVERY = Rule("0 (only at the end) or more", lambda v: v >= 0)
FRACTION = Rule("in [0, 1)", lambda v: 0 <= v < 1)


def check_values(c: RunConfig) -> None:
    """The first field whose value breaks its rule, as a RunConfigError (None is not checked)."""
    for f in dataclasses.fields(c):
        rule, value = f.metadata.get("rule"), getattr(c, f.name)
        if rule is None or value is None:
            continue
        number = (int,) if "integer" in rule.expected else (int, float)
        if isinstance(value, bool) or not isinstance(value, number):
            raise RunConfigError(f.name, f"must be {rule.expected}, got {shown(value)}")
        if isinstance(value, float) and not math.isfinite(value) or not rule.ok(value):
            raise RunConfigError(f.name, f"must be {rule.expected}, got {value}")


def check_choices(c: RunConfig) -> None:
    """Each field typed with a ``Literal`` holds one of its values, each ``bool`` a bool
    (None where the type allows it)."""
    for name, hint in typing.get_type_hints(type(c)).items():
        allowed = typing.get_args(hint) if _is_union(hint) else (hint,)
        value = getattr(c, name)
        if value is None and type(None) in allowed:
            continue
        literals = [
            v for a in allowed if typing.get_origin(a) is Literal for v in typing.get_args(a)
        ]
        boolean = bool in allowed
        if (
            boolean
            and isinstance(value, bool)
            or literals
            and value in literals
            and not (isinstance(value, bool) and not boolean)
        ):
            continue
        if literals and boolean:
            words = ", ".join(repr(v) for v in literals)
            raise RunConfigError(name, f"must be True, False or {words}, got {shown(value)}")
        if literals:
            raise RunConfigError(name, f"must be one of {literals}, got {shown(value)}")
        if boolean:
            raise RunConfigError(name, f"must be True or False, got {shown(value)}")


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def check_run(c: RunConfig) -> None:
    """Every check of a built config: each field's rule, and the options that go together."""
    check_choices(c)
    check_values(c)
    if c.corpus is not None and c.data is not None:
        raise ValueError("give --corpus or --data, not both")
    if c.bias is not None and c.task != "lm":
        raise RunConfigError("bias", f"is for lm (a GPT), not {c.task!r}")
    check_vision(c)
    if c.global_tokens and c.attention_window is None:
        raise RunConfigError("global_tokens", "needs --attention-window")
    if c.framework == "keras":
        check_keras(c)
    check_fine_tuning(c)
    check_arch(c)
    check_sae(c)


def check_sae(c: RunConfig) -> None:
    """A sparse autoencoder reads a model's hook point, transcoders its MLPs; their options
    are their own."""
    coders = ("sae", "transcoder")
    for name in ("model", "features", "k"):
        if getattr(c, name) is not None and c.task not in coders:
            raise RunConfigError(name, f"is for sae and transcoder, not {c.task!r}")
    if c.hook is not None and c.task != "sae":
        raise RunConfigError("hook", f"is for sae (a sparse autoencoder), not {c.task!r}")
    given = (("layers", c.layers), ("skip", c.skip or None), ("store", c.store),
             ("cross_layer", c.cross_layer or None))  # fmt: skip
    for name, value in given:
        if value is not None and c.task != "transcoder":
            raise RunConfigError(name, f"is for transcoder, not {c.task!r}")
    if c.task not in coders:
        return
    if c.model is None:
        raise RunConfigError("model", f"is needed: the model the {c.task} reads")
    if c.task == "sae" and c.hook is None:
        raise RunConfigError("hook", "is needed: the hook point the SAE reads")
    if c.tokenizer is not None:
        raise RunConfigError("tokenizer", f"is the model's own for {c.task}")


def check_vision(c: RunConfig) -> None:
    """Images have no tokenizer; patches are for images only."""
    if c.task == "vision" and c.tokenizer is not None:
        raise RunConfigError("tokenizer", "is for text; vision reads images (no tokenizer)")
    if c.task != "vision" and c.patch_size is not None:
        raise RunConfigError("patch_size", f"is for vision (images), not {c.task!r}")


def check_fine_tuning(c: RunConfig) -> None:
    """The fine-tuning options go with classify --init."""
    if c.init is not None and c.task != "classify":
        raise RunConfigError("init", f"starts a classifier (classify), not {c.task!r}")
    given = {
        "encoder_lr": c.encoder_lr is not None,
        "freeze_encoder_steps": c.freeze_encoder_steps != 0,
        "linear_probe": c.linear_probe,
    }
    for name, set_ in given.items():
        if set_ and c.init is None:
            raise RunConfigError(name, "is for fine-tuning a pretrained encoder: give --init")


def check_arch(c: RunConfig) -> None:
    """The classifier's shape is a classify option; with --init the pretrained model gives it."""
    if c.arch == "encoder":
        return
    if c.task != "classify":
        raise RunConfigError("arch", f"chooses a classifier's shape (classify), not {c.task!r}")
    if c.init is not None:
        raise RunConfigError("arch", f"comes from --init {one_line(c.init, 80)}: leave out --arch")
    if c.framework == "keras":
        raise RunConfigError("arch", "gpt is not in the Keras twin (--framework keras)")


def check_keras(c: RunConfig) -> None:
    """framework="keras" trains the classifier only, without the PyTorch-only options."""
    if c.task != "classify":
        raise RunConfigError(
            "framework", f"keras trains the classifier (classify) only, not {c.task!r}"
        )
    unsupported = {
        "--bf16": c.bf16 is True,
        "--compile": c.compile,
        "--accumulation": c.accumulation != 1,
        "--optimizer adam": c.optimizer != "adamw",
        "--init": c.init is not None,
    }
    given = [name for name, value in unsupported.items() if value]
    if given:
        raise ValueError(f"{', '.join(given)} cannot be used with --framework keras")
