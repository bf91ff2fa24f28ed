"""SAELens's file format for sparse autoencoders: ``cfg.json`` + ``sae_weights.safetensors``.

Written beside every glassformer SAE checkpoint (``checkpoint.COMPANION_FILES``), so
``sae_lens.SAE.load_from_disk(run/checkpoint)`` opens a glassformer-trained SAE; and read,
so ``SparseAutoencoder.from_pretrained(dir)`` opens SAELens's (``checkpoint`` sends a
directory with ``cfg.json`` and no ``config.json`` here).

The tensors are SAELens's: ``W_enc`` (d_in, d_sae), ``b_enc`` (d_sae), ``W_dec`` (d_sae,
d_in), ``b_dec`` (d_in), and ``threshold`` (d_sae) for JumpReLU. The config written is
SAELens 6's layout (the fields of ``SAEConfig`` and its architecture's, with the model's
details under ``metadata``) plus version 5's flat keys (``activation_fn_str``,
``activation_fn_kwargs``, ``hook_name``, ``hook_layer``, ...), which version 6 ignores and
version 5 needs. Read: both layouts, architectures "topk", "standard" (ReLU) and "jumprelu";
another (gated, batchtopk) is refused in one line. Checked against SAELens 6.54.12's own
loader (README: "Sparse autoencoders").
"""

from __future__ import annotations

import json
import re
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save

from glassformer.atomic import make_folder, write_directory_atomically
from glassformer.checkpoint import COMPANION_FILES, register_format
from glassformer.errors import CheckpointError, one_line, shown
from glassformer.interop._hf import check_directory, read_json
from glassformer.models.base import is_integer
from glassformer.models.sae import ARCHITECTURES, SAEConfig, SparseAutoencoder
from glassformer.models.transcoder import TranscoderConfig, Transcoders

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
SAE_LENS_VERSION = "6.0.0"  # the layout written: SAELens 6's (with version 5's keys beside)


def saelens_files(sae: SparseAutoencoder) -> dict[str, bytes]:
    """``cfg.json`` and ``sae_weights.safetensors`` of ``sae`` (the decoder norms folded in)."""
    weights = {name: t.contiguous() for name, t in sae.folded().items()}
    return {
        CFG_FILE: (json.dumps(saelens_config(sae.config), indent=2) + "\n").encode(),
        WEIGHTS_FILE: save(weights),
    }


def saelens_config(config: SAEConfig) -> dict[str, Any]:
    """The cfg.json of an SAE (see the module's docstring for the two layouts)."""
    layer = re.search(r"blocks\.(\d+)\.", config.hook_name)
    metadata = {
        "model_name": config.model_name,
        "hook_name": config.hook_name,
        "hook_head_index": None,
        "context_size": config.context_size,
        "prepend_bos": False,
        "dataset_path": config.dataset_path,
        "exclude_special_tokens": False,
        "model_class_name": "glassformer",
        "sae_lens_version": SAE_LENS_VERSION,
        "sae_lens_training_version": None,
        "seqpos_slice": [1, None] if config.skip_first else [None],
    }
    topk = config.architecture == "topk"
    v5 = {
        "activation_fn_str": "topk" if topk else "relu",
        "activation_fn_kwargs": {"k": config.k} if topk else {},
        "finetuning_scaling_factor": False,
        "hook_layer": int(layer.group(1)) if layer else 0,
        "dataset_trust_remote_code": False,
        **{k: v for k, v in metadata.items() if k != "sae_lens_version"},
    }
    cfg = {
        "architecture": config.architecture,
        "d_in": config.d_in,
        "d_sae": config.d_sae,
        "dtype": "float32",
        "device": "cpu",
        "apply_b_dec_to_input": config.apply_b_dec_to_input,
        "normalize_activations": "none",
        "reshape_activations": "none",
        "metadata": metadata,
        **({"k": config.k, "rescale_acts_by_decoder_norm": False} if topk else {}),
    }
    return {**v5, **cfg}


def read_saelens(path: str | Path, kind: str | None = None) -> SparseAutoencoder:
    """An SAE from a SAELens directory (version 5 or 6 layout). Its d_in and d_sae are
    held against the weights file's own shapes (its header: no tensor read) before the SAE,
    d_in × d_sae twice over, is built."""
    path = Path(path)
    check_directory(path, f"a SAELens directory holding {CFG_FILE}")
    cfg = read_json(path / CFG_FILE, "SAELens config")
    if kind not in (None, "sae"):
        raise CheckpointError(f"{path} holds a SAELens sparse autoencoder, expected {kind!r}")
    config = config_from_saelens(cfg, path)
    weights_file = path / WEIGHTS_FILE
    _check_shapes(config, weights_file)
    try:
        weights = load_file(str(weights_file))
    except Exception as e:  # safetensors raises its own types
        raise CheckpointError(f"cannot read {weights_file}: {one_line(e)}") from None
    scaling = weights.pop("scaling_factor", None)  # SAELens 5: all ones unless fine-tuned
    if scaling is not None and not torch.equal(scaling, torch.ones_like(scaling)):
        raise CheckpointError(f"{path} has a fine-tuning scaling factor, which is not read")
    if "log_threshold" in weights:  # a JumpReLU saved while training
        weights["threshold"] = weights.pop("log_threshold").exp()
    sae = SparseAutoencoder(config)
    sae.load_state_dict({k: v.float() for k, v in weights.items()}, strict=False)
    return sae.eval()


def _check_shapes(config: SAEConfig, weights_file: Path) -> None:
    """The tensors ``weights_file`` lists (read from its header) are the ones an SAE of
    ``config`` has, each of the shape it has there; else one error naming the file."""
    with torch.device("meta"):  # the shapes the config makes, without the memory
        wanted = {k: tuple(v.shape) for k, v in SparseAutoencoder(config).state_dict().items()}
    wanted.pop("since_fired")
    try:
        with safe_open(str(weights_file), framework="pt") as f:
            stored = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    except Exception as e:  # safetensors raises its own types
        raise CheckpointError(f"cannot read {weights_file}: {one_line(e)}") from None
    if "log_threshold" in stored:  # a JumpReLU saved while training
        stored["threshold"] = stored.pop("log_threshold")
    scaling = stored.pop("scaling_factor", None)
    if set(stored) != set(wanted):
        raise CheckpointError(
            f"{weights_file} holds {shown(sorted(stored), 300)}; a {config.architecture!r} SAE "
            f"has {sorted(wanted)}"
        )
    for name, shape in {**stored, "scaling_factor": scaling}.items():
        want = wanted.get(name, (config.d_sae,))
        if shape is not None and shape != want:
            raise CheckpointError(
                f"{weights_file}: {name} is {shape}, but {CFG_FILE} (d_in {config.d_in}, "
                f"d_sae {config.d_sae}) makes it {want}"
            )


def config_from_saelens(cfg: dict[str, Any], path: Path) -> SAEConfig:
    """An ``SAEConfig`` from a cfg.json of either layout."""
    if not isinstance(cfg, dict) or not isinstance(cfg.get("metadata") or {}, dict):
        raise CheckpointError(f"{path / CFG_FILE} is not a SAELens config: not a JSON object")
    meta = {**cfg, **(cfg.get("metadata") or {})}
    architecture = cfg.get("architecture", "standard")
    function = cfg.get("activation_fn_str", cfg.get("activation_fn"))
    if function == "topk" and architecture == "standard":  # SAELens 5's TopK
        architecture = "topk"
    if architecture not in ARCHITECTURES:
        raise CheckpointError(
            f"{path} holds a {shown(architecture)} SAE; glassformer reads "
            f"{', '.join(ARCHITECTURES)}"
        )
    normalize = cfg.get("normalize_activations", "none")
    if normalize not in ("none", None, False):
        raise CheckpointError(f"{path}: normalize_activations {shown(normalize)} is not read")
    kwargs = cfg.get("activation_fn_kwargs") or {}
    k = cfg.get("k") or (kwargs.get("k") if isinstance(kwargs, dict) else None) or 1
    try:
        return SAEConfig(
            d_in=cfg["d_in"],
            d_sae=cfg["d_sae"],
            architecture=architecture,
            k=k,
            apply_b_dec_to_input=bool(cfg.get("apply_b_dec_to_input", True)),
            rescale_acts_by_decoder_norm=bool(cfg.get("rescale_acts_by_decoder_norm", False)),
            model_name=str(meta.get("model_name") or ""),
            hook_name=str(meta.get("hook_name") or meta.get("hook_point") or ""),
            context_size=meta.get("context_size") or 128,
            dataset_path=str(meta.get("dataset_path") or ""),
            skip_first=_slice_start(meta.get("seqpos_slice")) == 1,
        )
    except KeyError as e:
        raise CheckpointError(f"{path / CFG_FILE} lacks the field {e}") from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path / CFG_FILE} is not a SAELens config: {one_line(e)}") from None


def _slice_start(seqpos_slice: Any) -> Any:
    """The first position a SAELens ``seqpos_slice`` ([start, stop] or None) keeps."""
    return seqpos_slice[0] if isinstance(seqpos_slice, list) and seqpos_slice else None


# ---- transcoders: SAELens's per-layer transcoder directories ------------------------------

TRANSCODER_ARCHITECTURES = {
    ("relu", False): "transcoder",
    ("relu", True): "skip_transcoder",
    ("jumprelu", False): "jumprelu_transcoder",
    ("jumprelu", True): "jumprelu_skip_transcoder",
}


def write_saelens_transcoders(tc: Transcoders, path: str | Path) -> Path:
    """Each layer of a per-layer set as a SAELens transcoder directory, ``path/blocks.{i}``
    (``cfg.json`` + ``sae_weights.safetensors``: ``W_enc`` (d_in, d_sae), ``b_enc``,
    ``W_dec`` (d_sae, d_out), ``b_dec``, and ``W_skip`` (d_out, d_in), ``threshold`` where
    the set has them), which ``sae_lens.SAE.load_from_disk`` opens. SAELens's transcoders are
    ReLU or JumpReLU and one layer each: TopK and cross-layer sets are refused."""
    config = tc.config
    kind = TRANSCODER_ARCHITECTURES.get((config.architecture, config.skip))
    if kind is None or config.cross_layer:
        raise ValueError(
            "SAELens's transcoders are per-layer ReLU or JumpReLU ones; these are "
            f"{'cross-layer' if config.cross_layer else config.architecture}"
        )
    weights = tc.folded()
    make_folder(Path(path))
    for i, layer in enumerate(config.layers):  # each layer's directory written atomically
        write_directory_atomically(Path(path) / f"blocks.{layer}",
                                   partial(_write_layer, config, weights, i, kind))  # fmt: skip
    return Path(path)


def _write_layer(config: TranscoderConfig, weights: dict[str, torch.Tensor], i: int, kind: str,
                 folder: Path) -> None:  # fmt: skip
    """Layer i's SAELens files into ``folder``."""
    tensors = {"W_enc": weights["W_enc"][i].T, "b_enc": weights["b_enc"][i],
               "W_dec": weights["W_dec"][i], "b_dec": weights["b_dec"][i]}  # fmt: skip
    if config.skip:
        tensors["W_skip"] = weights["W_skip"][i]
    if config.architecture == "jumprelu":
        tensors["threshold"] = weights["threshold"][i]
    (folder / WEIGHTS_FILE).write_bytes(save({k: v.contiguous() for k, v in tensors.items()}))
    cfg = {"architecture": kind, "d_in": config.d_model, "d_out": config.d_model,
           "d_sae": config.d_transcoder, "dtype": "float32", "device": "cpu",
           "apply_b_dec_to_input": False, "normalize_activations": "none",
           "reshape_activations": "none",
           "metadata": {"model_name": config.model_name, "hook_name": config.hook(i),
                        "hook_name_out": config.hook(i, "output"),
                        "context_size": config.context_size,
                        "dataset_path": config.dataset_path, "model_class_name": "glassformer",
                        "sae_lens_version": SAE_LENS_VERSION}}  # fmt: skip
    (folder / CFG_FILE).write_text(json.dumps(cfg, indent=2) + "\n")


def read_saelens_transcoders(path: str | Path) -> Transcoders:
    """A per-layer set from a folder of SAELens transcoder directories (any names; each
    ``cfg.json``'s ``hook_name`` says its block), their hooks and sizes held alike and every
    tensor's shape checked in its file's header before anything is built."""
    path = Path(path)
    check_directory(path, "a folder of SAELens transcoder directories")
    found = [_transcoder_layer(folder) for folder in sorted(path.iterdir())
             if (folder / CFG_FILE).is_file()]  # fmt: skip
    if not found:
        raise CheckpointError(f"{path} holds no SAELens transcoder directory")
    found.sort(key=lambda f: f[0])
    layers = [f[0] for f in found]
    if len(set(layers)) != len(layers):
        raise CheckpointError(f"{path}: two directories read the same block ({layers})")
    first = found[0]
    if any(f[1:4] != first[1:4] for f in found):
        raise CheckpointError(f"{path}: the layers' hooks, architectures or sizes differ")
    _, input_hook, output_hook, (architecture, d_model, d_sae), _, model_name = first
    config = TranscoderConfig(
        d_model=d_model, d_transcoder=d_sae, layers=tuple(layers),
        architecture="jumprelu" if "jumprelu" in architecture else "relu",
        skip="skip" in architecture, input_hook=input_hook, output_hook=output_hook,
        model_name=model_name)  # fmt: skip
    wanted = {"W_enc": (d_model, d_sae), "b_enc": (d_sae,), "W_dec": (d_sae, d_model),
              "b_dec": (d_model,)}  # fmt: skip
    if config.skip:
        wanted["W_skip"] = (d_model, d_model)
    if config.architecture == "jumprelu":
        wanted["threshold"] = (d_sae,)
    weights = [_layer_weights(f[4] / WEIGHTS_FILE, wanted) for f in found]
    state = {name: torch.stack([w[name].float() for w in weights]) for name in wanted}
    state["W_enc"] = state["W_enc"].mT.contiguous()
    tc = Transcoders(config)
    tc.load_state_dict({**state, "since_fired": tc.since_fired})
    return tc.eval()


def _transcoder_layer(folder: Path) -> tuple[Any, ...]:
    """(block, input hook, output hook, (architecture, d_in, d_sae), folder, model name) of
    one SAELens transcoder directory; one error if it is not one."""
    cfg = read_json(folder / CFG_FILE, "SAELens config")
    meta = {**cfg, **(cfg.get("metadata") or {})} if isinstance(cfg, dict) else {}
    architecture = meta.get("architecture")
    hook = re.match(r"blocks\.(\d+)\.(.+)$", str(meta.get("hook_name") or ""))
    out = re.match(r"blocks\.\d+\.(.+)$", str(meta.get("hook_name_out") or ""))
    sizes = (meta.get("d_in"), meta.get("d_out"), meta.get("d_sae"))
    if (architecture not in TRANSCODER_ARCHITECTURES.values() or hook is None
            or not all(is_integer(v) and 0 < int(v or 0) <= 1 << 20 for v in sizes)
            or sizes[0] != sizes[1]):  # fmt: skip
        raise CheckpointError(
            f"{folder / CFG_FILE}: not a SAELens transcoder of a block's MLP (architecture "
            f"{shown(architecture)}, hook {shown(meta.get('hook_name'))}, sizes {shown(sizes)})"
        )
    if meta.get("normalize_activations", "none") not in ("none", None, False):
        raise CheckpointError(f"{folder}: normalize_activations is not read")
    layer_sizes = (architecture, sizes[0], sizes[2])
    model_name = str(meta.get("model_name") or "")
    return (int(hook[1]), hook[2], out[1] if out else "hook_mlp_out", layer_sizes, folder,
            model_name)  # fmt: skip


def _layer_weights(file: Path, wanted: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """A layer's tensors, their names and shapes held against ``wanted`` from the header."""
    try:
        with safe_open(str(file), framework="pt") as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
            if shapes != wanted:
                raise CheckpointError(f"{file} holds {shown(shapes, 300)}; expected {wanted}")
            return {k: f.get_tensor(k) for k in wanted}
    except CheckpointError:
        raise
    except Exception as e:  # safetensors raises its own types
        raise CheckpointError(f"cannot read {file}: {one_line(e)}") from None


COMPANION_FILES["sae"] = saelens_files
register_format("saelens", "sae", read_saelens)
