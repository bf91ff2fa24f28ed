"""Checkpoints: a directory with config.json and model.safetensors.

    run/
      config.json        {"kind": "gpt", "config": {...}, "glassformer_version": "..."}
      model.safetensors  the weights (tied weights stored once)

A checkpoint is written into a temporary directory beside the target and renamed into
place, so a crash mid-save never leaves a half-written checkpoint under the real name.
Loading reads only JSON and safetensors: no pickle, no code execution.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model

from glassformer.models.base import MODEL_KINDS, PretrainedModel

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TRAINING_STATE_NAME = "training_state.pt"
CHECKPOINT_SUBDIR = "checkpoint"  # inside a training run directory


class CheckpointError(ValueError):
    """A path that is not a loadable glassformer checkpoint."""


def save_checkpoint(
    model: PretrainedModel,
    path: str | Path,
    *,
    training_state: dict[str, Any] | None = None,
    extra_files: dict[str, bytes] | None = None,
) -> Path:
    """Write ``model`` to the directory ``path`` atomically and return the path.

    Args:
        model: a glassformer model (a ``torch.compile``d one is unwrapped first).
        path: the checkpoint directory; replaced if it exists.
        training_state: what a resumed run needs (optimizer, step, RNG, data position),
            saved as training_state.pt; only tensors, numbers, strings, lists and dicts,
            so it loads with ``weights_only=True``.
        extra_files: more files to write into the directory (name → contents),
            e.g. ``tokenizer.json``.
    """
    model = getattr(model, "_orig_mod", model)  # torch.compile wraps; save the same keys
    if not isinstance(model, PretrainedModel):
        raise TypeError(f"expected a glassformer model, got {type(model).__name__}")
    meta = {"kind": model.kind, "config": model.config.to_dict(), "glassformer_version": _version()}

    def write(tmp: Path) -> None:
        (tmp / CONFIG_NAME).write_text(json.dumps(meta, indent=2) + "\n")
        save_model(model, str(tmp / WEIGHTS_NAME))
        if training_state is not None:
            torch.save(training_state, tmp / TRAINING_STATE_NAME)
        for name, data in (extra_files or {}).items():
            (tmp / name).write_bytes(data)

    return write_directory_atomically(Path(path), write)


def write_directory_atomically(path: Path, write: Callable[[Path], None]) -> Path:
    """Fill a temporary directory beside ``path`` with ``write(tmp)``, flush it to disk,
    then rename it into place: ``path`` is either the old directory or the complete new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        write(tmp)
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        _swap_into_place(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _swap_into_place(tmp: Path, path: Path) -> None:
    """Rename ``tmp`` to ``path``; an existing ``path`` is moved aside, then removed."""
    if not path.exists():
        os.replace(tmp, path)
        return
    old = path.with_name(f".{path.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(
    path: str | Path, *, kind: str | None = None, map_location: str | torch.device = "cpu"
) -> Any:
    """Load the model saved in directory ``path``.

    Args:
        path: a checkpoint directory written by ``save_checkpoint``.
        kind: if given, the model kind expected (e.g. "gpt"); another kind is an error.
        map_location: device for the weights.
    """
    path = resolve_checkpoint_dir(path)
    config_file = path / CONFIG_NAME
    if not config_file.is_file():
        raise CheckpointError(f"{path} is not a glassformer checkpoint: no {CONFIG_NAME} in it")
    try:
        meta = json.loads(config_file.read_text())
        if isinstance(meta, dict) and "kind" not in meta and "model_type" in meta:
            return _load_foreign(path, meta["model_type"], kind)
        saved_kind, values = meta["kind"], meta["config"]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{config_file} is not a glassformer config: {e}") from None
    if not isinstance(saved_kind, str) or not isinstance(values, dict):
        raise CheckpointError(f"{config_file} is not a glassformer config: bad 'kind' or 'config'")
    if saved_kind not in MODEL_KINDS:
        raise CheckpointError(
            f"{path} holds unknown model kind {saved_kind!r}; known: {sorted(MODEL_KINDS)}"
        )
    if kind is not None and saved_kind != kind:
        raise CheckpointError(f"{path} holds a {saved_kind!r} model, expected {kind!r}")
    cls = MODEL_KINDS[saved_kind]
    try:
        model = cls(cls.config_class.from_dict(values))
    except (TypeError, ValueError) as e:  # valid JSON, but not a config this kind can take
        raise CheckpointError(f"{config_file} holds a bad {saved_kind!r} config: {e}") from None
    weights = path / WEIGHTS_NAME
    if not weights.is_file():
        raise CheckpointError(f"{path} has no {WEIGHTS_NAME}")
    try:
        missing, unexpected = load_model(
            model, str(weights), strict=False, device=str(map_location)
        )
    except Exception as e:  # safetensors raises its own types for corrupt files and shapes
        raise CheckpointError(f"cannot load {weights}: {e}") from None
    if missing or unexpected:
        raise CheckpointError(
            f"{weights} does not match the {saved_kind!r} config: missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}"
        )
    model.eval()
    return model


def _load_foreign(path: Path, model_type: Any, kind: str | None) -> Any:
    """A Hugging Face checkpoint directory that ``glassformer.interop`` can read."""
    from glassformer.interop.bert import load_bert
    from glassformer.interop.gpt2 import load_gpt2

    readers = {"gpt2": ("gpt", load_gpt2), "bert": ("bert", load_bert)}
    if model_type not in readers:
        raise CheckpointError(
            f"{path} is a Hugging Face {model_type!r} checkpoint; glassformer reads "
            f"{sorted(readers)} directories"
        )
    our_kind, read = readers[model_type]
    if kind is not None and kind != our_kind:
        raise CheckpointError(f"{path} holds a {model_type!r} model, expected {kind!r}")
    return read(path)


def resolve_checkpoint_dir(path: str | Path) -> Path:
    """A checkpoint directory, or a training run directory holding one in ``checkpoint/``."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    if not (path / CONFIG_NAME).is_file() and (path / CHECKPOINT_SUBDIR / CONFIG_NAME).is_file():
        return path / CHECKPOINT_SUBDIR
    return path


def load_training_state(path: str | Path) -> dict[str, Any]:
    """The training state saved beside a checkpoint's weights, loaded with ``weights_only=True``
    (a pickle that tries to build anything but plain data is refused)."""
    file = resolve_checkpoint_dir(path) / TRAINING_STATE_NAME
    if not file.is_file():
        raise CheckpointError(f"{file.parent} has no {TRAINING_STATE_NAME}; it cannot be resumed")
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # an UnpicklingError for forbidden globals, others for corruption
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"cannot load {file}: {first_line}") from None


def _version() -> str:
    from glassformer import __version__

    return __version__
