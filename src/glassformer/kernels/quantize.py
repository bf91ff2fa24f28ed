"""A model made ready to decode in a chosen precision: ``model.for_inference(dtype)``.

- ``"fp32"``: as trained.
- ``"bf16"``: the blocks' linear layers store their weights in bfloat16 and multiply in it
  (``BF16Linear``: half the bytes a decoding step reads); everything else stays fp32: the
  residual stream, norms, softmax, the embeddings and the vocabulary head (the logits), as
  llama.cpp keeps its activations in fp32. Casting the whole model instead changed SmolLM2's
  answers (top-1 agreement with fp32 96.7%; ``glassformer.kernels.fidelity``).
- ``"int8"`` / ``"int4"``: every linear layer of the blocks and the output head stores its
  weight in 8 or 4 bits (``glassformer.kernels.quantized``): int4 where PyTorch's kernel
  takes the shape (N a multiple of 16, K of 32), int8 for the rest and for the vocabulary
  head (``VOCABULARY_HEADS``). The embeddings, norms and biases, and so the activations, are
  bf16: the dtype PyTorch's int8/int4 CPU kernels are built for. Quantisation costs some
  accuracy: the README gives the held-out perplexity of each against fp32.
- ``"gguf"``: a model read from a GGUF file computes from the file's own blocks
  (``glassformer.kernels.gguf_linear``: Q4_0 … Q6_K as stored, no second quantisation),
  everything else, and so the activations, in fp32.
- ``"gguf-q8"``: the same, but every product from the blocks rounds its input to 8 bits, each 32
  values to their own scale, much as llama.cpp does: no longer equal to the fp32 computation of
  the file's weights, and faster where a decoding step multiplies Q4_0 … Q5_1 or Q8_0 rows
  (in integers, with AVX-512 VNNI).
- ``"auto"``: bf16 if this machine multiplies the model's decoding shapes measurably faster
  in bf16 than in fp32 (``glassformer.kernels.precision``, measured once and cached) *and*
  bf16 keeps the model's answers on a calibration text (``glassformer.kernels.fidelity``:
  top-1 agreement and KL against fp32, measured once per model and cached), else fp32.
  Without calibration inputs (no tokenizer given) it keeps fp32. It never quantises: that is
  a choice of accuracy, left to the user.
"""

from __future__ import annotations

import ctypes
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from glassformer.kernels.fidelity import (
    Fidelity,
    cached_fidelity,
    compare,
    fingerprint,
    output_logits,
)
from glassformer.kernels.fidelity import calibration_inputs as text_inputs
from glassformer.kernels.fidelity import remember as remember_fidelity
from glassformer.kernels.gguf_linear import GGUFEmbedding, GGUFLinear, Part
from glassformer.kernels.gguf_mlp import FusedGatedFeedForward
from glassformer.kernels.precision import Measurement, check_dtype, resolve_dtype
from glassformer.kernels.quantized import (
    GGUF_DTYPES,
    QUANTISED,
    VOCABULARY_HEADS,
    BF16Linear,
    Int4Linear,
    Int8Linear,
    int4_group_size,
)
from glassformer.modules.feedforward import GatedFeedForward
from glassformer.modules.position import TokenEmbedding


@dataclass(frozen=True)
class InferencePrecision:
    """The precision a model decodes in (``model.precision``) and, for ``auto``, what chose
    it: the speed measurement and bf16's fidelity (None where not measured)."""

    dtype: str = "fp32"
    measurement: Measurement | None = None
    fidelity: Fidelity | None = None


def prepare_for_inference(
    model: Any,
    dtype: str = "auto",
    *,
    group_size: int | None = None,
    tokenizer: Any = None,
    calibration: tuple[torch.Tensor, ...] | None = None,
    **options: Any,
) -> InferencePrecision:
    """Put ``model`` in eval mode and in ``dtype`` (its layers changed in place) and return
    what was chosen (the model keeps it: ``PretrainedModel.for_inference``). ``auto`` checks
    bf16's fidelity on ``calibration`` (the model's inputs), or on the calibration text
    encoded by ``tokenizer``."""
    check_dtype(dtype)
    current = model.precision.dtype
    if current == dtype and dtype in GGUF_DTYPES:  # read straight into its blocks
        return model.precision
    if current in QUANTISED:
        raise ValueError(f"this model is already quantised to {current}; load it again first")
    if group_size is not None and dtype != "int4":  # before auto spends time measuring
        raise ValueError(f"group_size is for int4 weights, not {dtype}")
    device = next(model.parameters()).device
    chosen, measured = resolve_dtype(model, dtype, device, **options)
    fidelity = None
    model.eval()
    if dtype == "auto" and chosen == "bf16":  # faster: but does it still say the same?
        if calibration is None:
            calibration = text_inputs(model, tokenizer)
        fidelity = None if calibration is None else bf16_fidelity(model, calibration)
        chosen = "bf16" if fidelity is not None and fidelity.within_bound else "fp32"
    if chosen == "fp32":
        model.float()
    elif chosen == "bf16":
        use_bf16_products(model)
    elif chosen in GGUF_DTYPES:
        use_gguf_blocks(model, device, rounded=chosen == "gguf-q8")
        release_freed_memory()  # the fp32 layers replaced are gone now
    else:
        if chosen == "int4" and device.type != "cpu":
            raise ValueError(f"int4 weights run on the CPU only; the model is on {device}")
        # Quantised from the float32 weights; then everything else (embeddings, norms) and
        # so the activations go to bf16: PyTorch's int8/int4 CPU kernels are built for bf16
        # activations (fp32 ones ran 6-13x slower here, 2-core AMD EPYC, torch 2.13).
        model.float()
        _quantize_linears(model, chosen, group_size)
        model.to(torch.bfloat16)
    return InferencePrecision(chosen, measured, fidelity)


Replaced = list[tuple[nn.Module, str, nn.Module]]  # (parent, name, the layer it held)
# A mixture of experts' routing layers stay as they are: rounding their scores flips which
# experts a token goes to where two are close (llama.cpp keeps ffn_gate_inp unquantised too)
ROUTING = ("router", "shared_gate")


def replace_linears(
    model: nn.Module, twin: Callable[[nn.Linear, bool], nn.Module | None]
) -> Replaced:
    """Put ``twin(layer, is_vocabulary_head)`` in place of every ``nn.Linear`` under ``model``
    but the routing layers (``ROUTING``; None keeps the layer); returns what was replaced, so
    that ``undo`` can put it back."""
    replaced: Replaced = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear) or name in ROUTING:
                continue
            new = twin(child, parent is model and name in VOCABULARY_HEADS)
            if new is not None:
                setattr(parent, name, new)
                replaced.append((parent, name, child))
    return replaced


def use_bf16_products(model: nn.Module) -> Replaced:
    """Make every linear layer of ``model`` but the vocabulary head a ``BF16Linear``, and
    everything else fp32; returns what was replaced (``undo`` puts it back)."""
    model.float()
    return replace_linears(
        model, lambda layer, head: None if head else BF16Linear.from_linear(layer)
    )


def undo(replaced: Replaced) -> None:
    for parent, name, old in replaced:
        setattr(parent, name, old)


def bf16_fidelity(model: nn.Module, calibration: tuple[torch.Tensor, ...]) -> Fidelity:
    """The ``bf16`` precision's next-token distributions on ``calibration`` against the fp32
    model's (cached per machine, model and inputs); ``model`` is left as it was."""
    key = "bf16 products, head fp32; " + fingerprint(model, calibration)  # what was measured
    known = cached_fidelity(key)
    if known is not None:
        return known
    reference = output_logits(model.float(), calibration)
    replaced = use_bf16_products(model)
    try:
        measured = compare(reference, output_logits(model, calibration))
    finally:
        undo(replaced)
    remember_fidelity(key, measured)
    return measured


def use_gguf_blocks(model: Any, device: torch.device, rounded: bool = False) -> None:
    """Put the blocks of the GGUF file ``model`` was read from into its layers: each linear
    layer (and a token table) whose weight the file stores in a computed block type;
    ``rounded``: the products round their input to 8 bits (``GGUFLinear``)."""
    source = model.weights_source
    layers = [m for m in model.modules() if isinstance(m, GGUFLinear)]
    if source is None and layers:  # read straight into its blocks: from_pretrained(dtype=)
        if any(layer.rounded != rounded for layer in layers):
            raise ValueError(
                "this model was read into GGUF blocks for another dtype; load it again"
            )
        return
    if source is None:
        raise ValueError(
            "dtypes 'gguf' and 'gguf-q8' compute from a GGUF file's own blocks, and this model "
            "was not read from one (GPT.from_pretrained('model.gguf') or "
            "'SmolLM2-135M-Instruct')"
        )
    if device.type != "cpu":
        raise ValueError(f"GGUF blocks are computed on the CPU only; the model is on {device}")
    model.float()
    compute_from_blocks(model, source(), rounded)


def compute_from_blocks(model: nn.Module, blocks: dict[str, list[Part]], rounded: bool) -> None:
    """Make each layer whose weight ``blocks`` names ({weight name: its parts}, emptied as
    it goes, so that the blocks a layer keeps interleaved are freed one layer at a time)
    compute from those blocks: a linear layer becomes a ``GGUFLinear``, a token table a
    ``GGUFEmbedding``, and a gated MLP whose gate and up both do a ``FusedGatedFeedForward``.
    A layer of another kind keeps an fp32 weight: where it has none yet (a model built on
    the meta device to be read straight into its blocks), its parts decoded."""
    modules = dict(model.named_modules())
    # a file tensor's id → what a linear layer keeps of it (every file tensor lives from
    # before the loop until its entry is taken out: no two of them share an id)
    kept: dict[int, Tensor] = {}
    alone = _read_once(blocks, modules)
    for weight in sorted(blocks, key=lambda name: not _is_linear(modules, name)):
        parts = blocks.pop(weight)  # taken out: freed once a layer keeps its own copy
        path = weight.removesuffix(".weight")
        parent_path, _, name = path.rpartition(".")
        old = modules[path]
        if isinstance(old, nn.Linear):
            bias = None if old.bias is None else old.bias.detach()
            in_place = all(id(t) in alone for _, t in parts)  # no second copy while loading
            layer = GGUFLinear(parts, old.in_features, bias, rounded=rounded, in_place=in_place)
            kept.update((id(t), k) for (_, t), (_, k) in zip(parts, layer.stored(), strict=True))
            new: nn.Module = layer
        elif isinstance(old, TokenEmbedding) and len(parts) == 1:
            kind, table = parts[0]  # a tied head's rows, interleaved: one copy for both
            new = GGUFEmbedding((kind, kept.get(id(table), table)), old.embedding_dim, old.scale)
        else:  # stays in fp32
            weight_now = old.get_parameter("weight")
            if weight_now.is_meta:
                decoded = GGUFLinear(parts, weight_now.shape[-1]).dequantized()
                old.weight = nn.Parameter(decoded.view(weight_now.shape), requires_grad=False)
            continue
        setattr(modules[parent_path] if parent_path else model, name, new)
    for parent in list(model.modules()):  # gate and up in one product: one call a step
        for name, child in list(parent.named_children()):
            fused = (
                FusedGatedFeedForward.fuse(child, rounded)
                if type(child) is GatedFeedForward
                else None
            )
            if fused is not None:
                setattr(parent, name, fused)


def _read_once(blocks: dict[str, list[Part]], modules: dict[str, nn.Module]) -> set[int]:
    """The ids of the file tensors that only one layer reads (a tied token table reads what
    that layer keeps of it) and that share their memory with no other tensor: those a
    layer may interleave in place."""
    holders: defaultdict[int, set[int]] = defaultdict(set)  # memory address → tensor ids
    readers: Counter[int] = Counter()
    for weight, parts in blocks.items():
        table = isinstance(modules[weight.removesuffix(".weight")], TokenEmbedding)
        for _, t in parts:
            holders[t.untyped_storage().data_ptr()].add(id(t))
            readers[id(t)] += 0 if table and len(parts) == 1 else 1
    return {i for ids in holders.values() if len(ids) == 1 for i in ids if readers[i] == 1}


def _is_linear(modules: dict[str, nn.Module], weight: str) -> bool:
    return isinstance(modules[weight.removesuffix(".weight")], nn.Linear)


def release_freed_memory() -> None:
    """Hand the heap's freed memory back to the system (glibc's ``malloc_trim``): the fp32
    weights just replaced were freed, but glibc keeps freed memory for later, so SmolLM2's
    process stayed 720 MiB larger than its blocks need (132 MiB after the trim)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def _quantize_linears(model: nn.Module, dtype: str, group_size: int | None) -> None:
    """Replace every ``nn.Linear`` under ``model`` by its quantised twin."""

    def twin(layer: nn.Linear, head: bool) -> nn.Module:
        if dtype == "int4" and int4_fits(layer) and not head:
            size = group_size or int4_group_size(layer.in_features)
            return Int4Linear.from_linear(layer, size, torch.bfloat16)
        return Int8Linear.from_linear(
            layer, torch.bfloat16
        )  # int8, a head, or a shape int4 refuses

    replace_linears(model, twin)


def int4_fits(linear: nn.Linear) -> bool:
    """Whether PyTorch's int4 CPU kernel takes this shape: N a multiple of 16, K of 32."""
    return linear.out_features % 16 == 0 and linear.in_features % 32 == 0
