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
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save

from glassformer.checkpoint import COMPANION_FILES, register_format
from glassformer.errors import CheckpointError, one_line, shown
from glassformer.interop._hf import check_directory, read_json
from glassformer.models.sae import ARCHITECTURES, SAEConfig, SparseAutoencoder

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


COMPANION_FILES["sae"] = saelens_files
register_format("saelens", "sae", read_saelens)
