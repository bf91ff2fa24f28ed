"""What every model shares: the output type, config checks and presets, save/load.

A model is an ``nn.Module`` built from one dataclass config. Each model class names
its ``kind`` (the string stored in a checkpoint's config.json) and its config class;
subclasses register themselves so a checkpoint can be loaded without knowing its kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import torch
from torch import Tensor, nn

from glassformer.checkpoint import MODEL_KINDS, load_checkpoint, save_checkpoint
from glassformer.errors import shown
from glassformer.kernels.quantize import InferencePrecision, prepare_for_inference
from glassformer.models.checks import check_finite, check_window, fields_of, is_integer
from glassformer.models.legacy import upgrade_state_dict
from glassformer.modules.attention import check_dropout, check_heads
from glassformer.modules.feedforward import check_activation
from glassformer.modules.hooking import (
    OPT_IN,
    ActivationCache,
    HookFn,
    Names,
    attach_hooks,
    differentiable,
    gradients,
    hook_points,
)
from glassformer.modules.norms import NORMS
from glassformer.modules.position import POSITIONAL

__all__ = [
    "MAX_LAYERS", "MODEL_KINDS", "Activation", "ConfigBase", "ModelConfig", "ModelOutput",
    "Norm", "Pooling", "Positional", "PretrainedModel", "check_finite", "is_integer",
]  # fmt: skip

# the feed-forward's (modules.feedforward)
Activation = Literal["relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu_tanh"]
# How positions enter (modules.position); "sinusoidal_halves" is Marian's layout.
Positional = Literal["sinusoidal", "sinusoidal_halves", "learned", "rope"]
Norm = Literal["layer", "rms", "gemma_rms"]  # LayerNorm, RMSNorm, Gemma's (modules.norms)
Pooling = Literal["mean", "cls", "max"]  # how token states become one vector

# The fields of any config that are sizes (each a positive integer), and of them the layer
# counts, which have a ceiling far above any released model (Llama 3.1 405B has 126).
LAYER_COUNTS = ("num_layers", "num_encoder_layers", "num_decoder_layers")
SIZES = ("vocab_size", "src_vocab_size", "tgt_vocab_size", "num_classes", "d_model", "d_ff",
         "max_len", *LAYER_COUNTS)  # fmt: skip
MAX_LAYERS = 10_000

C = TypeVar("C", bound="ConfigBase")
M = TypeVar("M", bound="PretrainedModel")


@dataclass(frozen=True)
class ModelOutput:
    """The one type every model's forward returns.

    Attributes:
        logits: (B, C) for a classifier, (B, T, V) for language models and translators.
        loss: mean cross-entropy when labels were given, else None.
        encoder_attentions: per encoder layer, (B, H, S, S); only when asked for.
        decoder_attentions: per decoder (or GPT) layer, (B, H, T, T); only when asked for.
        cross_attentions: per decoder layer, (B, H, T, S); only when asked for.
    """

    logits: Tensor
    loss: Tensor | None = None
    encoder_attentions: tuple[Tensor, ...] | None = None
    decoder_attentions: tuple[Tensor, ...] | None = None
    cross_attentions: tuple[Tensor, ...] | None = None


class ConfigBase:
    """Mixin for model configs: presets by name, checks, dict round trip."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {}
    # Positional kinds beyond the embedding tables that this model supports ("rope").
    EXTRA_POSITIONAL: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def preset(cls: type[C], name: str, **overrides: Any) -> C:
        """A named preset (``tiny``, ``small``, ``base``, ...) with fields overridden."""
        if name not in cls.PRESETS:
            raise ValueError(
                f"unknown preset {name!r} for {cls.__name__}; known: {sorted(cls.PRESETS)}"
            )
        return cls(**{**cls.PRESETS[name], **overrides})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]  # every config is one

    @classmethod
    def from_dict(cls: type[C], values: dict[str, Any]) -> C:
        return cls(**fields_of(cls, values))

    def _check(self) -> None:
        """Checks common to all configs; each config's ``__post_init__`` calls this."""
        self._check_sizes()
        check_heads(self.d_model, self.num_heads, self.head_dim)  # type: ignore[attr-defined]
        check_dropout(self.dropout)  # type: ignore[attr-defined]
        check_dropout(self.attention_dropout, "attention_dropout")  # type: ignore[attr-defined]
        check_activation(self.activation)  # type: ignore[attr-defined]
        positional = self.positional  # type: ignore[attr-defined]
        allowed = sorted(POSITIONAL) + list(self.EXTRA_POSITIONAL)
        if positional not in allowed:
            raise ValueError(f"positional must be one of {allowed}, got {shown(positional)}")
        window = getattr(self, "attention_window", None)
        check_window(window)
        glob = getattr(self, "global_tokens", 0)
        if not isinstance(glob, int) or isinstance(glob, bool) or glob < 0:
            raise ValueError(f"global_tokens must be an integer >= 0, got {shown(glob)}")
        if glob and window is None:
            raise ValueError(f"global_tokens={glob} needs an attention_window")
        choices: tuple[tuple[str, list[Any]], ...] = (
            ("norm", list(NORMS)),
            ("bias", [True, False]),
        )
        for name, allowed in choices:
            if getattr(self, name) not in allowed:
                value = shown(getattr(self, name))
                raise ValueError(f"{name} must be one of {allowed}, got {value}")
        if positional == "sinusoidal" and self.d_model % 2:  # type: ignore[attr-defined]
            raise ValueError(f"sinusoidal positions need an even d_model, got {self.d_model}")  # type: ignore[attr-defined]

    def _check_sizes(self) -> None:
        """Sizes are positive integers, layer counts at most ``MAX_LAYERS`` (a config read
        from a file builds a list of that many layers before any weight is seen), and the
        norms' epsilon a finite number >= 0."""
        for name in SIZES:
            value = getattr(self, name, 1)
            if not is_integer(value) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {shown(value)}")
            if name in LAYER_COUNTS and value > MAX_LAYERS:
                raise ValueError(f"{name} must be at most {MAX_LAYERS}, got {shown(value)}")
        for name in ("layer_norm_eps", "norm_eps"):
            check_finite(name, getattr(self, name, None), minimum=0.0)


@dataclass(kw_only=True)
class ModelConfig(ConfigBase):
    """The fields every model config shares, with the paper's values as defaults; each
    model's config adds its own fields and changes the defaults where it differs.

    Attributes:
        max_len: the longest sequence (the position table's size).
        d_model: the width of the residual stream.
        num_heads: attention heads per layer.
        head_dim: each head's width; None for ``d_model // num_heads``.
        d_ff: the feed-forward's hidden width.
        dropout: on embeddings and sub-layer outputs.
        attention_dropout: on the attention weights.
        activation: the feed-forward's nonlinearity.
        norm_first: pre-norm (LayerNorm before each sub-layer) instead of the paper's post-norm.
        positional: sinusoidal (the paper) or learned position embeddings.
        qkv_bias: biases on the query, key and value projections.
        pad_id: the padding token (ignored by losses, masks and pooling); None for none.
        attention_window: w: local (sliding-window) self-attention, each position attends
            the w positions before it and, in an encoder, the w after it, in time and memory
            linear in the length; None (the paper) attends to all.
        global_tokens: with a window, the first this many positions see and are seen by
            every position (Longformer's [CLS]; in a causal stack, attention sinks).
        norm, layer_norm_eps: "layer" (LayerNorm, the paper's), "rms" or "gemma_rms"; eps.
        bias: biases in every linear layer and norm (False: none, q, k and v included).
        scale_embeddings: the token embeddings × √d_model (the paper's translator).
    """

    max_len: int = 512
    d_model: int = 512
    num_heads: int = 8
    head_dim: int | None = None
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation: Activation = "relu"
    norm_first: bool = False
    positional: Positional = "sinusoidal"
    qkv_bias: bool = True
    pad_id: int | None = 0
    attention_window: int | None = None
    global_tokens: int = 0
    norm: Norm = "layer"
    layer_norm_eps: float = 1e-5
    bias: bool = True
    scale_embeddings: bool = False


class PretrainedModel(nn.Module):
    """Base of every model: registry by kind, ``save_pretrained``/``from_pretrained``."""

    kind: ClassVar[str]
    config_class: ClassVar[type]
    config: Any
    precision: InferencePrecision = InferencePrecision()  # fp32 until ``for_inference``
    # How to read the weights again in the form they are stored in (a GGUF file's blocks,
    # {weight name: parts}), for ``for_inference``; None for a model made here.
    weights_source: Callable[[], dict[str, Any]] | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            MODEL_KINDS[cls.kind] = cls

    def remember_source(self, source: Callable[[], dict[str, Any]]) -> None:
        """Keep a reader's way back to the file the weights came from (``weights_source``)."""
        self.weights_source = source

    def save_pretrained(self, path: str | Path, **kwargs: Any) -> Path:
        """Write this model as a checkpoint directory (config.json + model.safetensors)."""
        return save_checkpoint(self, path, **kwargs)

    @classmethod
    def from_pretrained(cls: type[M], path: str | Path, **kwargs: Any) -> M:
        """Load a checkpoint directory written by ``save_pretrained`` (or a foreign one
        that ``glassformer.interop`` reads, or a packaged model by name)."""
        return load_checkpoint(path, kind=cls.kind, **kwargs)

    @classmethod
    def upgrade_state_dict(cls, state: dict[str, Any]) -> dict[str, Any]:
        """A saved state dict under today's names: checkpoints written before the blocks
        took their parts are renamed (``models.legacy``); others come back as they are."""
        return upgrade_state_dict(cls.kind, state)

    def load_extra_files(self, directory: Path) -> None:
        """Read what a checkpoint holds beside the weights (a tokenizer, ...); nothing here."""

    def for_inference(
        self: M,
        dtype: str = "auto",
        *,
        group_size: int | None = None,
        tokenizer: Any = None,
        calibration: tuple[Tensor, ...] | None = None,
    ) -> M:
        """This model, in eval mode, in the precision ``dtype`` for decoding (changed in
        place and returned, like ``.to()``):

        - ``"fp32"``; ``"bf16"`` (the linear layers' products in bf16, everything between
          them, the vocabulary head and so the logits in fp32);
        - ``"int8"`` / ``"int4"``: the linear layers' weights quantised (one scale per
          output row; int4 a scale and a zero per ``group_size`` input columns, by default
          32, GGUF's Q4 blocks), everything else and so the activations in bf16, which PyTorch's
          int8/int4 CPU kernels are built for;
        - ``"auto"``: bf16 where this machine runs the model's decoding products measurably
          faster in it *and* bf16 keeps the model's answers (top-1 agreement and KL against
          fp32 within ``glassformer.kernels.fidelity``'s bound) on ``calibration`` (the model's
          inputs) or on the bundled calibration text encoded by ``tokenizer``; else fp32
          (also when neither is given). Both are measured once and cached. It never quantises.

        The precision chosen is ``model.precision.dtype`` (with ``auto``'s measurements). A
        quantised model cannot be trained or saved: load the checkpoint again for that.
        """
        self.precision = prepare_for_inference(
            self, dtype, group_size=group_size, tokenizer=tokenizer, calibration=calibration
        )
        return self

    # ---- looking inside: hook points (glassformer.modules.hooks, .hooking) -------------

    def hook_names(self) -> list[str]:
        """Every hook point of this model, in the module tree's order (see ``hooks``)."""
        return list(hook_points(self))

    def hooks(
        self,
        hooks: Sequence[tuple[Names, HookFn]] = (),
        *,
        backward: Sequence[tuple[Names, HookFn]] = (),
    ) -> AbstractContextManager[None]:
        """``with model.hooks([(name, fn), ...]): ...``: while the block runs, ``fn(value,
        name)`` sees each value at ``name`` (a name, a list, a glob pattern such as
        ``"*.hook_pattern"`` or a predicate) and may return a replacement. ``backward``
        pairs see the gradient flowing back through those names, ``fn(grad, name)``, when a
        loss computed in the block is differentiated, and may return a replacement."""
        return attach_hooks(self, hooks, backward)

    def run_with_hooks(
        self,
        *inputs: Any,
        hooks: Sequence[tuple[Names, HookFn]] = (),
        backward_hooks: Sequence[tuple[Names, HookFn]] = (),
        **kwargs: Any,
    ) -> Any:
        """``self(*inputs, **kwargs)`` with ``hooks`` attached (see ``hooks``), and
        ``backward_hooks`` on the gradients at their names: they run when the caller
        differentiates something computed from the output (``out.loss.backward()``)."""
        with self.hooks(hooks, backward=backward_hooks):
            return self(*inputs, **kwargs)

    def run_with_cache(
        self,
        *inputs: Any,
        names: Names = None,
        detach: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        grads: bool | Callable[[Any], Tensor] = False,
        **kwargs: Any,
    ) -> tuple[Any, ActivationCache]:
        """``(self(*inputs, **kwargs), cache)``: the cache holds the value at every hook
        point ``names`` picks (a list, a glob pattern or a predicate; by default all but
        the per-head results, ``hook_result``, which are H times the attention output: ask
        for them by name), detached unless ``detach=False``, and moved to ``device`` or cast
        to ``dtype`` as they are taken (to keep a large cache off the GPU, or in bf16).
        Attention's scores and weights are computed on the readable path when they are asked
        for, and only then.

        ``grads``: also the gradient of a number at each of those values, under the value's
        name + ``"_grad"`` (``blocks.3.hook_resid_pre_grad``): a function of the output
        giving a scalar tensor (a logit difference), or True for the output's ``loss`` (pass
        the labels). Frozen and inference-mode models' activations get gradients too; the
        parameters' ``.grad`` are not touched. With ``detach=False`` the values stay in the
        pass's graph, which is kept, for further products with it."""
        if names is None:
            names = [n for n in self.hook_names() if not n.endswith(OPT_IN)]
        values: dict[str, Tensor] = {}
        live: dict[str, Tensor] = {}  # the values the pass goes on with, for their gradients

        def keep(value: Tensor, name: str) -> Tensor | None:
            if grads:
                value = live[name] = differentiable(value)
            kept = value.detach() if detach else value
            values[name] = kept.to(device=device, dtype=dtype) if device or dtype else kept
            return value if grads else None

        with self.hooks([(names, keep)]), torch.enable_grad() if grads else nullcontext():
            output = self(*inputs, **kwargs)
            if grads:
                found = gradients(_metric_of(output, grads), live, retain_graph=not detach)
                values.update({n: g.to(device=device, dtype=dtype) for n, g in found.items()})
        return output, ActivationCache(values)

    def explain(self, tokenizer: Any, text: str, **options: Any) -> Any:
        """The explorable forward pass of this model on ``text``: an offline page of every
        step's real tensor, formula and source line (``glassformer.viz.explain``), which a
        notebook shows inline and ``.save(path)`` writes."""
        make = PAGES.get("explain")
        if make is None:
            raise RuntimeError("import glassformer (its viz package makes the page)")
        return make(self, tokenizer, text, **options)

    def num_parameters(self) -> int:
        """Number of distinct parameters, frozen ones included (tied weights counted once)."""
        return sum(p.numel() for p in self.parameters())


# pages of a model that the packages above models make (``viz`` registers ``explain``), so a
# model offers them as methods without importing what sits above it
PAGES: dict[str, Callable[..., Any]] = {}


def _metric_of(output: Any, grads: bool | Callable[[Any], Tensor]) -> Tensor:
    """What ``run_with_cache(grads=)`` differentiates: ``grads(output)``, or the loss."""
    if callable(grads):
        return grads(output)
    loss = getattr(output, "loss", None)
    if loss is None:
        raise ValueError(
            "grads=True differentiates the output's loss, and this call computed none: pass "
            "the labels, or grads=a function of the output (a logit difference)"
        )
    return loss
