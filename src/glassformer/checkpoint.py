"""Checkpoints: a directory with config.json and model.safetensors.

    run/
      config.json        {"kind": "gpt", "config": {...}, "glassformer_version": "..."}
      model.safetensors  the weights (tied weights stored once)

A checkpoint is written into a temporary directory beside the target and renamed into
place (``glassformer.atomic``), so a crash mid-save (even ``kill -9``) never leaves a
half-written checkpoint under the real name: the name holds the previous checkpoint or the
new one, whole. A crash between the two renames that replace one is repaired by the next
save, and loading finds the previous checkpoint in ``.NAME.old`` meanwhile. A full disk or
another write error raises ``CheckpointSaveError`` and leaves the previous checkpoint as it was.

Loading reads only JSON and safetensors: no pickle, no code execution. The config's sizes
are checked against the tensors the safetensors header lists before any memory is taken
(``_build_to_fit``). The training state (``training_state.pt``) is unpickled with
``weights_only=True``: plain data only.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_model

from glassformer._version import __version__
from glassformer.atomic import previous_name, write_directory_atomically
from glassformer.errors import CheckpointError, CheckpointSaveError, one_line, shown
from glassformer.hub import resolve as resolve_hub_id
from glassformer.kernels.quantized import QUANTISED

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TRAINING_STATE_NAME = "training_state.pt"
CHECKPOINT_SUBDIR = "checkpoint"  # inside a training run directory

__all__ = [
    "CHECKPOINT_SUBDIR", "MODEL_KINDS", "CheckpointError", "CheckpointSaveError",
    "load_checkpoint", "register_format", "register_named", "save_checkpoint",
]  # fmt: skip

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
    quantised = model.precision.dtype
    if quantised in QUANTISED:
        raise ValueError(
            f"this model's weights are quantised to {quantised} for inference; save the "
            "model before for_inference(), or load its checkpoint again"
        )
    meta = {
        "kind": model.kind,
        "config": model.config.to_dict(),
        "glassformer_version": __version__,
    }

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


def load_checkpoint(
    path: str | Path,
    *,
    kind: str | None = None,
    map_location: str | torch.device = "cpu",
    revision: str | None = None,
    **options: Any,
) -> Any:
    """Load the model saved in directory ``path``, or the packaged model of that name.

    Args:
        path: a checkpoint directory written by ``save_checkpoint`` (or a training run
            directory holding one), a foreign directory a reader was registered for
            (Hugging Face GPT-2 and BERT: see ``glassformer.interop``), a packaged model's
            name (``"all-MiniLM-L6-v2"``) or a Hub id (``"org/name"``: ``glassformer.hub``).
        kind: if given, the model kind expected (e.g. "gpt"); another kind is an error.
        map_location: device for the weights.
        revision: a Hub id's branch, tag or commit.
        options: passed to a packaged model's loader (``cache_dir=`` for MiniLM) or a GGUF
            file's (``dtype="gguf"``: computing from the file's blocks, read straight into them).
    """
    if str(path) in NAMED_MODELS:
        named_kind, loader = NAMED_MODELS[str(path)]
        if kind is not None and kind != named_kind:
            raise CheckpointError(f"{path!r} is a {named_kind!r} model, expected {kind!r}")
        return loader(**options)
    path = resolve_hub_id(path, revision)
    if Path(path).suffix == ".gguf" and Path(path).is_file():  # llama.cpp's one-file format
        return _load_foreign(Path(path), ".gguf", kind, **options)
    if options:
        raise TypeError(f"unexpected option(s) {sorted(options)} for a checkpoint directory")
    path = resolve_checkpoint_dir(path)
    config_file = path / CONFIG_NAME
    for marker, model_type in FOREIGN_MARKERS.items():  # SAELens: cfg.json, no config.json
        if not config_file.is_file() and (path / marker).is_file():
            return _load_foreign(path, model_type, kind)
    if not config_file.is_file():
        raise CheckpointError(f"{path} is not a glassformer checkpoint: no {CONFIG_NAME} in it")
    meta = _read_meta(config_file)
    if "kind" not in meta and "model_type" in meta:
        return _load_foreign(path, meta["model_type"], kind)
    saved_kind, values = meta.get("kind"), meta.get("config")
    if not isinstance(saved_kind, str) or not isinstance(values, dict):
        raise CheckpointError(f"{config_file} is not a glassformer config: bad 'kind' or 'config'")
    if saved_kind not in MODEL_KINDS:
        raise CheckpointError(
            f"{path} holds unknown model kind {shown(saved_kind)}; known: {sorted(MODEL_KINDS)}"
        )
    if kind is not None and saved_kind != kind:
        raise CheckpointError(f"{path} holds a {saved_kind!r} model, expected {kind!r}")
    weights = path / WEIGHTS_NAME
    if not weights.is_file():
        raise CheckpointError(f"{path} has no {WEIGHTS_NAME}")
    model = _build_to_fit(MODEL_KINDS[saved_kind], values, config_file, weights)
    _load_weights(model, weights, map_location)
    model.load_extra_files(path)
    return model.eval()


def _read_meta(config_file: Path) -> dict[str, Any]:
    """config.json as a dict; anything else (not text, not JSON, nested too deeply, an int of
    thousands of digits) is one ``CheckpointError`` naming the file."""
    try:
        meta = json.loads(config_file.read_text())
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError too
        problem = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise CheckpointError(f"{config_file} is not a glassformer config: {problem}") from None
    return meta


def _build_to_fit(cls: Any, values: dict[str, Any], config_file: Path, weights: Path) -> Any:
    """The model config.json describes, built only once ``weights`` is known to hold it: a
    config's numbers (a billion layers, a vocabulary of 10^12) would take all memory before
    a weight is read. Its sizes are checked against the safetensors header, it is built on
    the meta device (no memory) and compared with the header's shapes, then built for real."""
    stored = _stored_shapes(weights, cls)
    try:
        config = cls.config_class.from_dict(values)
        _check_sizes(config, stored, config_file, weights)
        with torch.device("meta"):
            skeleton = cls(config)
    except CheckpointError:
        raise
    except (TypeError, ValueError, RuntimeError) as e:  # not a config this kind can take
        raise CheckpointError(f"{config_file} is a bad {cls.kind} config: {one_line(e)}") from None
    _check_fit(skeleton, stored, config, config_file, weights)
    return cls(config)


LAYER_COUNTS = ("num_layers", "num_encoder_layers", "num_decoder_layers")
WIDTHS = ("vocab_size", "src_vocab_size", "tgt_vocab_size", "num_classes", "d_model", "d_ff")


def _check_sizes(config: Any, stored: dict, config_file: Path, weights: Path) -> None:
    """Each layer holds a tensor of its own, and each width is some stored tensor's length
    along an axis: a config asking for more cannot fit the file, and building it (even on
    the meta device) could take all memory and time."""
    longest = max((max(shape, default=1) for shape in stored.values()), default=0)
    for name in (*LAYER_COUNTS, *WIDTHS):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > (len(stored) if name in LAYER_COUNTS else longest):
            raise CheckpointError(
                f"{config_file}: {name} is {shown(value)}, but {weights.name} holds {len(stored)} "
                f"tensors, none longer than {longest}"
            )


def _stored_shapes(weights: Path, cls: Any) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape from the safetensors header (no tensor is read), today's names."""
    try:
        with safe_open(str(weights), framework="pt") as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    except Exception as e:  # safetensors raises its own types for corrupt headers
        raise CheckpointError(f"cannot load {weights}: {one_line(e)}") from None
    return cls.upgrade_state_dict(shapes)


def _check_fit(
    skeleton: Any, stored: dict[str, tuple[int, ...]], config: Any, config_file: Path, weights: Path
) -> None:
    """The meta-device model ``skeleton`` takes exactly the stored tensors, in their shapes
    (one tied to another may be missing; its modules' own renames of older names apply),
    and its buffers that are not stored (the sinusoidal table) take no more memory than the
    weights file or 64 MiB."""
    expected = skeleton.state_dict(keep_vars=True)
    for name, have in stored.items():
        want = tuple(expected[name].shape) if name in expected else have
        if have != want:
            raise CheckpointError(
                f"cannot load {weights}: {config_file.name} says {_field(config, want, have)}, "
                f"but its {name} is {have} (the config makes it {want})"
            )
    fake = {name: torch.empty(shape, device="meta") for name, shape in stored.items()}
    try:
        missing, unexpected = skeleton.load_state_dict(fake, strict=False)
    except RuntimeError as e:  # a shape that does not fit, under an older name
        raise CheckpointError(f"cannot load {weights}: {one_line(e)}") from None
    loaded = {id(t) for name, t in expected.items() if name not in missing}
    missing = [name for name in missing if id(expected[name]) not in loaded]  # tied ones are
    if missing or unexpected:
        raise CheckpointError(
            f"{weights} does not match the config in {config_file.name}: missing "
            f"{sorted(missing)[:8]}, unexpected {sorted(unexpected)[:8]}"
        )
    budget = max(weights.stat().st_size, 64 << 20)
    for name, buffer in skeleton.named_buffers():
        if name not in expected and buffer.numel() * buffer.element_size() > budget:
            raise CheckpointError(
                f"{config_file}: {_field(config, tuple(buffer.shape), ())} makes the "
                f"{name} table {tuple(buffer.shape)}, more memory than {weights.name} holds"
            )


def _field(config: Any, want: tuple[int, ...], have: tuple[int, ...]) -> str:
    """The config field (name and value) behind the first dimension where ``want`` differs
    from ``have``: the one to blame in an error."""
    for i, size in enumerate(want):
        if i < len(have) and have[i] == size:
            continue
        for f in dataclasses.fields(config):
            value = getattr(config, f.name)
            if value == size and isinstance(value, int) and not isinstance(value, bool):
                return f"{f.name} {value}"
    return f"the shape {want}"


def _load_weights(model: Any, weights: Path, map_location: Any) -> None:
    """The safetensors file's weights into ``model``, under today's names (a model class may
    rename what older versions saved: ``upgrade_state_dict``); ``_check_fit`` has made sure
    that they fit, and one tied to another (stored once) is loaded through it."""
    try:
        state = model.upgrade_state_dict(load_file(str(weights), device=str(map_location)))
        model.load_state_dict(state, strict=False)
    except Exception as e:  # safetensors raises its own types for corrupt files
        raise CheckpointError(f"cannot load {weights}: {one_line(e)}") from None


def _load_foreign(path: Path, model_type: Any, kind: str | None, **options: Any) -> Any:
    """A foreign (Hugging Face) checkpoint directory that a registered reader understands."""
    readers = FOREIGN_FORMATS.get(model_type) if isinstance(model_type, str) else None
    if not readers:
        raise CheckpointError(
            f"{path} is a Hugging Face {shown(model_type)} checkpoint; glassformer reads "
            f"{sorted(FOREIGN_FORMATS)} directories"
        )
    if kind is None:
        kind = next(iter(readers))
    if kind not in readers:
        raise CheckpointError(f"{path} holds a {model_type!r} model, expected {kind!r}")
    return readers[kind](path, **options)


def resolve_checkpoint_dir(path: str | Path) -> Path:
    """A checkpoint directory, or a training run directory holding one in ``checkpoint/``.

    Where a save was killed between its two renames, the previous checkpoint is read from
    ``.NAME.old`` (see the module notes).
    """
    path = Path(path)
    if not path.exists() and (previous_name(path) / CONFIG_NAME).is_file():
        return previous_name(path)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    if not (path / CONFIG_NAME).is_file():
        inner = path / CHECKPOINT_SUBDIR
        if (inner / CONFIG_NAME).is_file():
            return inner
        if not inner.exists() and (previous_name(inner) / CONFIG_NAME).is_file():
            return previous_name(inner)
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
    return one_line(first.split(". This is an internal")[0])  # PyTorch's words on bad zips
