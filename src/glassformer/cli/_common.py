"""Helpers the subcommands share: loading a run's model and tokenizer, reading inputs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from glassformer.checkpoint import resolve_checkpoint_dir
from glassformer.inference import load_run
from glassformer.kernels.precision import DTYPES, decoding_measurement
from glassformer.kernels.quantized import GGUF_DTYPES
from glassformer.models.base import PretrainedModel


def reading_options(model: str, dtype: str) -> dict[str, Any]:
    """What to read a model with for ``--dtype``: a GGUF file (or the packaged SmolLM2) that
    will compute from its blocks is read straight into them (``dtype="gguf"``), never into
    an fp32 model first; everything else as it is."""
    from glassformer.interop.smollm2 import SMOLLM2_NAME

    gguf = model == SMOLLM2_NAME or (Path(model).suffix == ".gguf" and Path(model).is_file())
    return {"dtype": dtype} if gguf and dtype in GGUF_DTYPES else {}


def load_model_dir(path: str, kind: str | None) -> tuple[Any, Any, Path]:
    """(model, tokenizer, checkpoint dir) from a run directory or a checkpoint directory."""
    model, tokenizer = load_run(path, kind=kind)
    return model, tokenizer, resolve_checkpoint_dir(path)


def inputs(texts: list[str]) -> list[str]:
    """The texts given as arguments, or else one per line from standard input."""
    if texts:
        return texts
    if sys.stdin.isatty():
        raise ValueError("give the text as arguments or pipe it in, one per line")
    lines = [line.rstrip("\n") for line in sys.stdin]
    return [line for line in lines if line.strip()]


def read_lines(path: str) -> list[str]:
    """The non-blank lines of a UTF-8 text file (a clear ValueError if it is not one)."""
    from glassformer.data.files import read_text

    return [line for line in read_text(path).split("\n") if line.strip()]


def one_token(tokenizer: Any, text: str, flag: str) -> int:
    """The id of ``text``, which must encode to one token (the message names ``flag``)."""
    ids = tokenizer.encode(text)
    if len(ids) != 1:
        raise ValueError(f"{flag} {text!r} must be one token, but it encodes to {len(ids)}")
    return ids[0]


def add_dtype_argument(p: argparse.ArgumentParser) -> None:
    """``--dtype``: the precision the model decodes in (``model.for_inference``)."""
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help="decode in this precision: fp32; bf16 products (the residual stream, norms and "
        "logits stay fp32); int8/int4 weight-only "
        "quantisation (some accuracy lost: see the README); gguf: a GGUF model computes from "
        "its file's own blocks (SmolLM2's Q4_1, a Q4_K_M file's K-quants), exactly; gguf-q8: "
        "the same with every product's input rounded to 8 bits, much as llama.cpp does (faster, "
        "not exact); auto: bf16 where this machine measures it faster than fp32 and its "
        "next-token distributions agree with fp32's on a calibration text, else fp32",
    )


def for_inference(model: PretrainedModel, dtype: str, tokenizer: Any = None) -> Any:
    """``model.for_inference(dtype, tokenizer=tokenizer)``, saying on stderr what ``auto``
    chose and why (the speed figure, and bf16's fidelity where it was measured), and warning
    when an explicit ``bf16`` is measured slower here than fp32."""
    if dtype == "bf16":
        slower = decoding_measurement(model, next(model.parameters()).device)
        if slower.speedup < 1.0:
            print(
                f"warning: --dtype bf16 is slower than fp32 here: {slower.describe()}",
                file=sys.stderr,
            )
    model = model.for_inference(dtype, tokenizer=tokenizer)
    if dtype == "auto":
        print(f"precision: {describe_choice(model)}", file=sys.stderr)
    return model


def describe_choice(model: PretrainedModel) -> str:
    """What ``auto`` chose for ``model`` and both figures it chose by."""
    speed, fidelity = model.precision.measurement, model.precision.fidelity
    if speed is None:  # not chosen by measurement
        return model.precision.dtype
    said = f"{model.precision.dtype} (speed: {speed.describe()}"
    if fidelity is not None:
        said += f"; bf16 against fp32: {fidelity.describe()}"
    elif speed.bf16_faster:
        said += "; bf16's fidelity not measured: no calibration text for this model"
    return said + ")"
