"""What reading any Hugging Face directory takes: its config, its tensors, a checked load."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from glassformer.checkpoint import CheckpointError, unpickling_problem

M = TypeVar("M", bound=nn.Module)


def read_config(path: Path, model_type: str) -> dict[str, Any]:
    """``config.json`` of a Hugging Face directory whose ``model_type`` is ``model_type``."""
    config_file = path / "config.json"
    try:
        hf = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{config_file} is not a readable config: {e}") from None
    if not isinstance(hf, dict) or hf.get("model_type") != model_type:
        raise CheckpointError(f"{path} is not a {model_type} checkpoint")
    return hf


def build_config(make: Callable[[dict[str, Any]], Any], hf: dict[str, Any], path: Path) -> Any:
    """``make(hf)``, with a missing field or a value glassformer refuses as one clear error."""
    try:
        return make(hf)
    except CheckpointError:
        raise
    except KeyError as e:
        raise CheckpointError(f"{path / 'config.json'} lacks the field {e}") from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path / 'config.json'}: {e}") from None


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
    return model_holding(cls, config, convert(read_weights(path), config))


def taker(state: dict[str, Tensor], family: str) -> Callable[[str], Tensor]:
    """``take(name)``: the tensor ``name`` of ``state``, or one error naming what is missing."""

    def take(name: str) -> Tensor:
        if name not in state:
            raise CheckpointError(f"{family} weights have no {name!r}")
        return state[name]

    return take


def load_weights(model: M, state: dict[str, Tensor]) -> M:
    """Load converted weights after checking every shape against the model's; eval mode."""
    _check_shapes(model, state)
    model.load_state_dict(state)
    return model.eval()


def _check_shapes(model: nn.Module, state: dict[str, Tensor]) -> None:
    """Every weight of ``state`` has the shape its place in ``model`` has (names the model
    lacks are left to ``load_state_dict``)."""
    expected = model.state_dict()
    for name, value in state.items():
        if name in expected and value.shape != expected[name].shape:
            raise CheckpointError(
                f"the weight for {name} has shape {tuple(value.shape)}, the config "
                f"asks for {tuple(expected[name].shape)}"
            )


def model_holding(cls: Callable[[Any], M], config: Any, state: dict[str, Tensor]) -> M:
    """A model of ``config`` whose parameters are ``state``'s tensors themselves, in eval
    mode: built on the meta device, so no random initial weights are ever allocated (or
    computed), and the peak memory of a load is the weights once, not twice.

    Buffers that follow from the config (rotary frequencies, sinusoidal tables) are
    computed again; tied weights are tied again.
    """
    with torch.device("meta"):
        model = cls(config)
    _check_shapes(model, state)
    try:
        model.load_state_dict(state, assign=True)
    except RuntimeError as e:  # missing or unexpected names
        raise CheckpointError(f"the weights do not fit the config: {e}") from None
    for module in model.modules():  # the modules with such buffers have reset_buffers
        if any(b.is_meta for b in module.buffers(recurse=False)):
            module.reset_buffers()  # type: ignore[operator]
    if getattr(config, "tie_weights", False):
        model.tie_weights()  # type: ignore[operator]
    return model.eval()


def read_weights(path: Path) -> dict[str, Tensor]:
    """The tensors of a Hugging Face directory: safetensors (one file or shards) or a
    ``pytorch_model.bin`` unpickled with ``weights_only=True`` (no code runs)."""
    from safetensors.torch import load_file

    if (path / "model.safetensors").is_file():
        return _guarded(load_file, path / "model.safetensors")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        state: dict[str, Tensor] = {}
        for shard in _shards(index):
            state.update(_guarded(load_file, shard))
        return state
    if (path / "pytorch_model.bin").is_file():
        return _guarded(
            lambda f: torch.load(f, map_location="cpu", weights_only=True),
            path / "pytorch_model.bin",
        )
    raise CheckpointError(f"{path} has no model.safetensors or pytorch_model.bin")


def _shards(index: Path) -> list[Path]:
    """The shard files a ``model.safetensors.index.json`` names, each checked to lie in
    its directory (a name like ``../x`` or an absolute path is refused)."""
    try:
        names = set(json.loads(index.read_text())["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{index} is not a readable shard index: {e!r}") from None
    folder = index.parent.resolve()
    shards = []
    for name in sorted(map(str, names)):
        shard = (folder / name).resolve()
        if not shard.is_relative_to(folder):
            raise CheckpointError(f"{index} names a shard outside its directory: {name!r}")
        shards.append(shard)
    return shards


def _guarded(load, file: Path) -> dict[str, Tensor]:
    try:
        with warnings.catch_warnings():  # a pickle protocol warning: any failure is said below
            warnings.simplefilter("ignore", UserWarning)
            return load(str(file))
    except Exception as e:  # corrupt or foreign files; pickles with code are refused
        raise CheckpointError(f"cannot load {file}: {unpickling_problem(e)}") from None
