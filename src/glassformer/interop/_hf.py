"""What reading any Hugging Face directory takes: its config, its tensors, a checked load.

A directory is someone else's files, read within bounds: a config or a shard index of a few
megabytes at most, nested no deeper than Python parses (``read_json``); the config's fields
checked (``_fields``) before any reader uses them; the model built on the meta device and
held against the weights' shapes before it takes any memory (``skeleton``); every failure
one ``CheckpointError`` naming the file or directory (``naming``).

Every file a shard index names lies in the directory. The one exception is the layout of
huggingface_hub's cache, whose snapshots hold symbolic links into their own repository's
``blobs/``; a link into another repository, or anywhere else, is refused:

    models--org--name/
      blobs/<hash>                                     the files' bytes
      refs/main                                        the revision a name points at
      snapshots/<revision>/model-00001-of-00002.safetensors -> ../../blobs/<hash>
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from glassformer.checkpoint import CheckpointError, unpickling_problem
from glassformer.errors import one_line, shown
from glassformer.interop._fields import check_fields

M = TypeVar("M", bound=nn.Module)

MAX_JSON_BYTES = 16 << 20  # a config.json is kilobytes
MAX_INDEX_BYTES = 64 << 20  # DeepSeek-V3's shard index, 91 000 tensors, is 9 MB
MAX_SHARDS = 100_000
TABLE_BYTES = 64 << 20  # a table computed from the config (sinusoids) may always be this big
HUB_REPOSITORIES = ("models--", "datasets--", "spaces--")  # huggingface_hub's folder names


def read_json(file: Path, what: str, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The JSON document in ``file`` (``what`` it should be: "config"), or one error naming
    the file: missing or not a regular file (a FIFO would wait, /dev/zero never end), more
    than ``max_bytes``, not JSON, or nested past what Python's parser takes."""
    if not file.is_file():
        raise CheckpointError(f"{file} {'is not a file' if file.exists() else 'does not exist'}")
    try:
        with open(file, "rb") as f:
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            problem = f"it is larger than {max_bytes:,} bytes"
        else:
            return json.loads(data)
    except RecursionError:
        problem = "it is nested too deeply"
    except (OSError, ValueError) as e:  # JSONDecodeError, UnicodeDecodeError: ValueErrors
        problem = getattr(e, "strerror", None) or str(e)
    raise CheckpointError(f"{file} is not a readable {what}: {problem}")


def check_directory(path: Path, expected: str) -> None:
    """``path`` is a directory, or one error naming it as the user gave it (not the
    ``x.gguf/config.json`` that reading inside a file would name)."""
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a directory; expected {expected}")


def read_config(path: Path, model_type: str) -> dict[str, Any]:
    """``config.json`` of a Hugging Face directory whose ``model_type`` is ``model_type``."""
    check_directory(path, "a Hugging Face checkpoint directory holding config.json")
    hf = read_json(path / "config.json", "config")
    if not isinstance(hf, dict) or hf.get("model_type") != model_type:
        raise CheckpointError(f"{path} is not a {model_type} checkpoint")
    return hf


def build_config(make: Callable[[dict[str, Any]], Any], hf: dict[str, Any], path: Path) -> Any:
    """``make(hf)``, the fields checked first (``check_fields``): a missing field, a value
    outside what glassformer reads or a family's refusal is one error naming the file (the
    directory ``path``'s config.json, or ``path`` itself, a GGUF file whose metadata ``hf``
    is)."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    try:
        check_fields(hf)
        return make(hf)
    except KeyError as e:
        raise CheckpointError(f"{file} lacks the field {e}") from None
    except (ValueError, TypeError, ArithmeticError, AttributeError) as e:  # and CheckpointError
        raise _named(file, e) from None


@contextmanager
def naming(source: Path) -> Iterator[None]:
    """A ``CheckpointError`` raised inside names ``source`` (the directory or file being
    read) where it does not already: "Llama weights have no 'x'" says whose."""
    try:
        yield
    except CheckpointError as e:
        raise _named(source, e) from None


def _named(source: Path, error: Exception) -> CheckpointError:
    message = one_line(error)
    return CheckpointError(message if str(source) in message else f"{source}: {message}")


def load_directory(
    cls: Callable[[Any], M],
    path: str | Path,
    model_type: str,
    make_config: Callable[[dict[str, Any]], Any],
    convert: Callable[[dict[str, Tensor], Any], dict[str, Tensor]],
) -> M:
    """A ``cls`` model of the Hugging Face directory ``path`` (whose config.json says
    ``model_type``): its config read by ``make_config``, its tensors renamed by ``convert``."""
    path = Path(path)
    config = build_config(make_config, read_config(path, model_type), path)
    with naming(path):
        return model_holding(cls, config, converted(convert, read_weights(path), config))


def converted(convert: Callable[[Any, Any], dict[str, Tensor]], state: Any, config: Any) -> Any:
    """``convert(state, config)``, where tensors whose shapes disagree with each other (q
    and k of different widths, a fused projection of the wrong size) are one error, not the
    RuntimeError of the ``torch.cat`` or ``reshape`` that met them."""
    try:
        return convert(state, config)
    except RuntimeError as e:
        raise CheckpointError(f"the weights do not fit the config: {one_line(e)}") from None


def taker(state: dict[str, Tensor], family: str) -> Callable[[str], Tensor]:
    """``take(name)``: the tensor ``name`` of ``state``, or one error naming what is missing."""

    def take(name: str) -> Tensor:
        if name not in state:
            raise CheckpointError(f"{family} weights have no {name!r}")
        return state[name]

    return take


class _NoInitialisation(torch.overrides.TorchFunctionMode):
    """``torch.nn.init``'s draws made no-ops: on the meta device there is nothing to draw,
    and PyTorch's meta path for them imports TorchDynamo (74 MiB and a second, measured on
    torch 2.13) into a process that may never compile."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


def skeleton(cls: Callable[[Any], M], config: Any, state: dict[str, Tensor]) -> M:
    """``cls(config)`` on the meta device (no memory, no random numbers), held against
    ``state`` before anything is allocated from the config's numbers: every weight's shape,
    and every table the config alone makes (a sinusoidal one, max_len × d_model) no larger
    than the weights or ``TABLE_BYTES``."""
    with torch.device("meta"), _NoInitialisation():
        model = cls(config)
    expected = model.state_dict()
    for name, value in state.items():  # names the model lacks are load_state_dict's to say
        if name in expected and value.shape != expected[name].shape:
            raise CheckpointError(
                f"the weight for {name} has shape {tuple(value.shape)}, the config "
                f"asks for {tuple(expected[name].shape)}"
            )
    budget = max(sum(t.numel() * t.element_size() for t in state.values()), TABLE_BYTES)
    for name, buffer in model.named_buffers():
        if name not in state and buffer.numel() * buffer.element_size() > budget:
            raise CheckpointError(
                f"the config makes {name} of shape {tuple(buffer.shape)}, larger than all "
                "the weights together"
            )
    return model


def load_weights(cls: Callable[[Any], M], config: Any, state: dict[str, Tensor]) -> M:
    """A ``cls`` model of ``config`` with ``state`` copied into its own parameters (in their
    dtype), in eval mode; held against ``state`` on the meta device first (``skeleton``),
    so that no number of the config allocates memory the weights do not confirm."""
    skeleton(cls, config, state)
    model = cls(config)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:  # missing or unexpected names
        raise CheckpointError(f"the weights do not fit the config: {one_line(e)}") from None
    return model.eval()


def model_holding(cls: Callable[[Any], M], config: Any, state: dict[str, Tensor]) -> M:
    """A model of ``config`` whose parameters are ``state``'s tensors themselves, in eval
    mode: built on the meta device (``skeleton``), so no random initial weights are ever
    allocated (or computed), and the peak memory of a load is the weights once, not twice.

    Buffers that follow from the config (rotary frequencies, sinusoidal tables) are
    computed again; tied weights are tied again.
    """
    model = skeleton(cls, config, state)
    try:
        model.load_state_dict(state, assign=True)
    except RuntimeError as e:  # missing or unexpected names
        raise CheckpointError(f"the weights do not fit the config: {one_line(e)}") from None
    reset_meta_buffers(model)
    if getattr(config, "tie_weights", False):
        model.tie_weights()  # type: ignore[operator]
    return model.eval()


def reset_meta_buffers(model: nn.Module) -> None:
    """Compute again the buffers still on the meta device: the tables a config makes
    (rotary frequencies, sinusoids); the modules holding them have ``reset_buffers``."""
    for module in model.modules():
        if any(b.is_meta for b in module.buffers(recurse=False)):
            module.reset_buffers()  # type: ignore[operator]


def read_weights(path: Path) -> dict[str, Tensor]:
    """The tensors of a Hugging Face directory: safetensors (one file or shards) or a
    ``pytorch_model.bin`` unpickled with ``weights_only=True`` (no code runs); each file
    in the directory, or in its hub-cache repository's ``blobs/`` (``inside``)."""
    from safetensors.torch import load_file

    if (path / "model.safetensors").is_file():
        return _guarded(load_file, inside(path, "model.safetensors", path, "weights file"))
    index = path / "model.safetensors.index.json"
    if index.is_file():
        state: dict[str, Tensor] = {}
        for shard in _shards(index):
            state.update(_guarded(load_file, shard))
        return state
    if (path / "pytorch_model.bin").is_file():
        return _guarded(
            lambda f: torch.load(f, map_location="cpu", weights_only=True),
            inside(path, "pytorch_model.bin", path, "weights file"),
        )
    raise CheckpointError(f"{path} has no model.safetensors or pytorch_model.bin")


def _shards(index: Path) -> list[Path]:
    """The shard files a ``model.safetensors.index.json`` names (at most ``MAX_SHARDS``),
    each checked to lie in its directory (``inside``)."""
    data = read_json(index, "shard index", MAX_INDEX_BYTES)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(name, str) for name in weight_map.values()
    ):
        raise CheckpointError(
            f"{index} is not a readable shard index: expected a weight_map of tensor names "
            "to file names"
        )
    names = sorted(set(weight_map.values()))
    if len(names) > MAX_SHARDS:
        raise CheckpointError(f"{index} names {len(names)} shards; at most {MAX_SHARDS} are read")
    return [inside(index.parent, name, index) for name in names]


def inside(folder: Path, name: str, named_by: Path, what: str = "shard") -> Path:
    """The file ``name`` of ``folder`` (``what`` ``named_by`` names), resolved; refused where
    it leaves the folder: a name with ``..`` or an absolute one, a symbolic link to a file
    elsewhere. Only a snapshot of huggingface_hub's cache may link out, into its own
    repository's ``blobs/`` (see the module's notes)."""
    folder = folder.resolve()
    target = (folder / name).resolve()
    if ".." not in Path(name).parts and not Path(name).is_absolute():
        blobs = _hub_blobs(folder)
        if target.is_relative_to(folder) or (blobs is not None and target.parent == blobs):
            return target
    raise CheckpointError(f"{named_by} names a {what} outside its directory: {shown(name)}")


def _hub_blobs(folder: Path) -> Path | None:
    """The resolved ``blobs/`` of the huggingface_hub cache repository whose snapshot
    holds ``folder`` (``models--org--name/snapshots/<revision>/...``); None elsewhere."""
    for snapshot in (folder, *folder.parents):
        if snapshot.parent.name == "snapshots":
            repository = snapshot.parent.parent
            blobs = repository / "blobs"
            if repository.name.startswith(HUB_REPOSITORIES) and blobs.is_dir():
                return blobs.resolve()
            return None
    return None


def _guarded(load: Callable[[str], dict[str, Tensor]], file: Path) -> dict[str, Tensor]:
    try:
        with warnings.catch_warnings():  # a pickle protocol warning: any failure is said below
            warnings.simplefilter("ignore", UserWarning)
            return load(str(file))
    except Exception as e:  # corrupt or foreign files; pickles with code are refused
        raise CheckpointError(f"cannot load {file}: {unpickling_problem(e)}") from None
