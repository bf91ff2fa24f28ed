"""Checkpoints: a directory with config.json and model.safetensors.

    run/
      config.json        {"kind": "gpt", "config": {...}, "glassformer_version": "..."}
      model.safetensors  the weights (tied weights stored once)

A checkpoint is written into a temporary directory beside the target and renamed into
place, so a crash mid-save (even ``kill -9``) never leaves a half-written checkpoint under
the real name: the name holds the previous checkpoint or the new one, whole. Replacing an
existing one takes two renames (old → ``.NAME.old``, new → NAME); a crash between them is
repaired by the next load or save, which find the previous checkpoint in ``.NAME.old``.
Temporaries a killed save left behind are removed by the next save (one writer per
checkpoint directory). A full disk or another write error raises ``CheckpointSaveError``
and leaves the previous checkpoint as it was.

Loading reads only JSON and safetensors: no pickle, no code execution. The training state
(``training_state.pt``) is unpickled with ``weights_only=True``: plain data only.
"""

from __future__ import annotations

import errno
import io
import json
import os
import pickle
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_model

from glassformer._version import __version__
from glassformer.errors import CheckpointError, CheckpointSaveError
from glassformer.modules.quantized import QUANTISED

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TRAINING_STATE_NAME = "training_state.pt"
CHECKPOINT_SUBDIR = "checkpoint"  # inside a training run directory

__all__ = [
    "CHECKPOINT_SUBDIR",
    "MODEL_KINDS",
    "CheckpointError",
    "CheckpointSaveError",
    "load_checkpoint",
    "register_format",
    "register_named",
    "save_checkpoint",
]

# The registries that let this module load any model without importing one (models sit
# above checkpoints; interop above models):
#   model kind ("gpt") -> its class; every PretrainedModel subclass adds itself.
MODEL_KINDS: dict[str, Any] = {}
#   Hugging Face ``model_type`` -> {glassformer kind -> reader(path)}; interop registers them.
FOREIGN_FORMATS: dict[str, dict[str, Callable[..., Any]]] = {}
#   packaged model name ("all-MiniLM-L6-v2") -> (kind, loader(**options)).
NAMED_MODELS: dict[str, tuple[str, Callable[..., Any]]] = {}
#   packaged model name -> tokenizer(model): the tokenizer that goes with it.
NAMED_TOKENIZERS: dict[str, Callable[[Any], Any]] = {}
#   model kind -> files(model): another library's files of the same weights, written into
#   every checkpoint of that kind (an SAE's SAELens files); interop registers them. The file
#   that marks a foreign directory without a config.json -> its format's model type. A format
#   whose file holds its own tokenizer (".gguf") -> tokenizer(path).
COMPANION_FILES: dict[str, Callable[[Any], dict[str, bytes]]] = {}
FOREIGN_MARKERS = {"cfg.json": "saelens"}
FOREIGN_TOKENIZERS: dict[str, Callable[[Path], Any]] = {}


def register_format(model_type: str, kind: str, reader: Callable[[Path], Any]) -> None:
    """Let ``load_checkpoint`` read a foreign directory whose config.json says ``"model_type":
    model_type``, as a model of ``kind`` (the first registered: the one given no kind)."""
    FOREIGN_FORMATS.setdefault(model_type, {})[kind] = reader


def register_named(
    name: str,
    kind: str,
    loader: Callable[..., Any],
    *,
    tokenizer: Callable[[Any], Any] | None = None,
) -> None:
    """Let ``load_checkpoint(name)`` (and ``from_pretrained(name)``) load a packaged model;
    ``tokenizer(model)`` gives its tokenizer (for ``load_run(name)`` and the CLI)."""
    NAMED_MODELS[name] = (kind, loader)
    if tokenizer is not None:
        NAMED_TOKENIZERS[name] = tokenizer


def save_checkpoint(
    model: Any,
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
        extra_files: more files to write into it (name → contents: ``tokenizer.json``).
    """
    model = getattr(model, "_orig_mod", model)  # torch.compile wraps; save the same keys
    kinds = tuple(MODEL_KINDS.values())
    if not isinstance(model, kinds):
        raise TypeError(f"expected a glassformer model, got {type(model).__name__}")
    quantised = getattr(model, "inference_dtype", None)
    if quantised in QUANTISED:
        raise ValueError(
            f"this model's weights are quantised to {quantised} for inference; save the "
            "model before for_inference(), or load its checkpoint again"
        )
    meta = {"kind": model.kind, "config": model.config.to_dict(), "glassformer_version": _version()}

    def write(tmp: Path) -> None:
        (tmp / CONFIG_NAME).write_text(json.dumps(meta, indent=2) + "\n")
        _save_weights(model, tmp / WEIGHTS_NAME)
        if training_state is not None:
            # Through memory: torch.save reports a failed write (a full disk) as a bare
            # RuntimeError; Python's own write raises the OSError that says what happened.
            buffer = io.BytesIO()
            torch.save(training_state, buffer)
            (tmp / TRAINING_STATE_NAME).write_bytes(buffer.getbuffer())
        companions = COMPANION_FILES.get(model.kind, lambda model: {})(model)
        for name, data in {**companions, **(extra_files or {})}.items():
            (tmp / name).write_bytes(data)

    return write_directory_atomically(Path(path), write)


def _save_weights(model: Any, file: Path) -> None:
    """safetensors' ``save_model`` (tied weights stored once), with a failed write raised as
    the ``OSError`` it is: the library reports "No space left on device (os error 28)" as
    its own error type."""
    try:
        save_model(model, str(file))
    except Exception as e:
        found = re.search(r"\(os error (\d+)\)", str(e))
        if found is None:
            raise
        code = int(found.group(1))
        raise OSError(code, os.strerror(code), str(file)) from None


def write_directory_atomically(path: Path, write: Callable[[Path], None]) -> Path:
    """Fill a temporary directory beside ``path`` with ``write(tmp)``, flush it to disk,
    then rename it into place: ``path`` is either the old directory or the complete new one.

    Raises:
        CheckpointSaveError: writing failed with an ``OSError`` (a full disk, ...).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _recover(path)
        _remove_leftovers(path)  # a killed save's temporaries: free their space first
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    except OSError as e:
        raise _save_error(path, e) from None
    try:
        write(tmp)
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        _swap_into_place(tmp, path)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _save_error(path, e) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _old_name(path: Path) -> Path:
    """Where the previous checkpoint waits while the new one is renamed into place."""
    return path.with_name(f".{path.name}.old")


def _recover(path: Path) -> None:
    """Put the previous checkpoint back if a save was killed between its two renames."""
    old = _old_name(path)
    if not path.exists() and old.is_dir():
        os.replace(old, path)


def _remove_leftovers(path: Path) -> None:
    for leftover in path.parent.glob(f".{path.name}.*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)


def _save_error(path: Path, e: OSError) -> CheckpointSaveError:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        reason = "no space left on device" if e.errno == errno.ENOSPC else "disk quota exceeded"
        message = f"{reason} while saving checkpoint to {path}"
    else:
        message = f"cannot save checkpoint to {path}: {e.strerror or e}"
    if path.exists():
        message += "; the previous checkpoint there is intact"
    error = CheckpointSaveError(message)
    error.errno = e.errno
    return error


def _swap_into_place(tmp: Path, path: Path) -> None:
    """Rename ``tmp`` to ``path``; an existing ``path`` is moved aside, then removed."""
    if not path.exists():
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        return
    old = _old_name(path)
    shutil.rmtree(old, ignore_errors=True)
    os.replace(path, old)
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    shutil.rmtree(old, ignore_errors=True)


def _fsync_dir(directory: Path) -> None:
    """Make the renames durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_checkpoint(
    path: str | Path,
    *,
    kind: str | None = None,
    map_location: str | torch.device = "cpu",
    **options: Any,
) -> Any:
    """Load the model saved in directory ``path``, or the packaged model of that name.

    Args:
        path: a checkpoint directory written by ``save_checkpoint`` (or a training run
            directory holding one), a foreign directory a reader was registered for
            (Hugging Face GPT-2 and BERT: see ``glassformer.interop``), or the name of a
            packaged model (``"all-MiniLM-L6-v2"``).
        kind: if given, the model kind expected (e.g. "gpt"); another kind is an error.
        map_location: device for the weights.
        options: passed to a packaged model's loader (``cache_dir=`` for MiniLM).
    """
    if str(path) in NAMED_MODELS:
        named_kind, loader = NAMED_MODELS[str(path)]
        if kind is not None and kind != named_kind:
            raise CheckpointError(f"{path!r} is a {named_kind!r} model, expected {kind!r}")
        return loader(**options)
    if options:
        raise TypeError(f"unexpected option(s) {sorted(options)} for a checkpoint directory")
    if Path(path).suffix == ".gguf" and Path(path).is_file():  # llama.cpp's one-file format
        return _load_foreign(Path(path), ".gguf", kind)
    path = resolve_checkpoint_dir(path)
    config_file = path / CONFIG_NAME
    for marker, model_type in FOREIGN_MARKERS.items():  # SAELens: cfg.json, no config.json
        if not config_file.is_file() and (path / marker).is_file():
            return _load_foreign(path, model_type, kind)
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
    _load_weights(model, weights, saved_kind, map_location)
    model.load_extra_files(path)
    model.eval()
    return model


def _load_weights(model: Any, weights: Path, kind: str, map_location: Any) -> None:
    """The safetensors file's weights into ``model``, under today's names (a model class may
    rename what older versions saved: ``upgrade_state_dict``). Every weight must fit; one
    tied to another (stored once) is loaded through it."""
    try:
        state = load_file(str(weights), device=str(map_location))
    except Exception as e:  # safetensors raises its own types for corrupt files
        raise CheckpointError(f"cannot load {weights}: {e}") from None
    upgrade = getattr(model, "upgrade_state_dict", None)
    if upgrade is not None:
        state = upgrade(state)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # a shape that does not fit
        raise CheckpointError(f"cannot load {weights}: {e}") from None
    current = model.state_dict()
    loaded = {current[k].data_ptr() for k in state if k in current}
    missing = [k for k in missing if current[k].data_ptr() not in loaded]  # tied ones are
    if missing or unexpected:
        raise CheckpointError(
            f"{weights} does not match the {kind!r} config: missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}"
        )


def _load_foreign(path: Path, model_type: Any, kind: str | None) -> Any:
    """A foreign (Hugging Face) checkpoint directory that a registered reader understands."""
    readers = FOREIGN_FORMATS.get(model_type) if isinstance(model_type, str) else None
    if not readers:
        raise CheckpointError(
            f"{path} is a Hugging Face {model_type!r} checkpoint; glassformer reads "
            f"{sorted(FOREIGN_FORMATS)} directories"
        )
    if kind is None:
        kind = next(iter(readers))
    if kind not in readers:
        raise CheckpointError(f"{path} holds a {model_type!r} model, expected {kind!r}")
    return readers[kind](path)


def resolve_checkpoint_dir(path: str | Path) -> Path:
    """A checkpoint directory, or a training run directory holding one in ``checkpoint/``.

    Where a save was killed between its two renames, the previous checkpoint is read from
    ``.NAME.old`` (see the module notes).
    """
    path = Path(path)
    if not path.exists() and (_old_name(path) / CONFIG_NAME).is_file():
        return _old_name(path)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    if not (path / CONFIG_NAME).is_file():
        inner = path / CHECKPOINT_SUBDIR
        if (inner / CONFIG_NAME).is_file():
            return inner
        if not inner.exists() and (_old_name(inner) / CONFIG_NAME).is_file():
            return _old_name(inner)
    return path


def load_training_state(path: str | Path) -> dict[str, Any]:
    """The training state saved beside a checkpoint's weights, loaded with ``weights_only=True``
    (a pickle that tries to build anything but plain data is refused)."""
    file = resolve_checkpoint_dir(path) / TRAINING_STATE_NAME
    if not file.is_file():
        raise CheckpointError(f"{file.parent} has no {TRAINING_STATE_NAME}; it cannot be resumed")
    try:
        with warnings.catch_warnings():  # a foreign pickle's protocol warning: the error says it
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # an UnpicklingError for forbidden globals, others for corruption
        raise CheckpointError(f"cannot load {file}: {unpickling_problem(e)}") from None


def unpickling_problem(error: Exception) -> str:
    """What went wrong in ``torch.load(..., weights_only=True)``, in one short line.

    torch's own message for a refused pickle spans several lines and suggests retrying
    with ``weights_only=False``, which is exactly what must not be done with such a file.
    """
    text = str(error).strip()
    if isinstance(error, pickle.UnpicklingError) and text.startswith("Weights only load failed"):
        found = re.search(r"GLOBAL (\S+)", text)
        what = f"unpickling it would call {found[1]}" if found else "it is not a plain-data pickle"
        return (
            f"refused: {what} (glassformer reads only tensors, numbers, strings, lists and "
            "dicts from a pickle; never load this file with weights_only=False)"
        )
    first = text.splitlines()[0] if text else type(error).__name__
    return first.split(". This is an internal")[0]  # PyTorch's boilerplate on corrupt zips


def _version() -> str:
    return __version__
