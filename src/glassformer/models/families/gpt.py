"""The textbook decoder (GPT-2's block by default, the modern one by its fields): ``GPTConfig``.

Unlike the pretrained families beside it, whose parts are fixed and whose configs hold only
what varies within the family, this config names every part, so one config spans the
decoders a course builds: ``positional`` ("learned" GPT-2, "rope", "sinusoidal"), ``norm``
("layer", "rms"), ``activation`` ("gelu", "swiglu", ...), ``bias``, ``num_kv_heads``,
``attention_window``. ``models.parts.decoder_only`` builds its blocks. GPT-2's published
weights map onto it (``interop.gpt2``). ``GPTClassifierConfig`` puts a class head on the
same decoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from glassformer.errors import shown
from glassformer.models import parts
from glassformer.models.base import Activation, ModelConfig, Positional, check_finite
from glassformer.models.families import legacy
from glassformer.models.families.decoder import DecoderConfig, Readout


@dataclass(kw_only=True)
class GPTConfig(ModelConfig):
    """Configuration of ``GPT``. ``d_ff`` defaults to 4·``d_model``.

    ``pad_id`` may be None for vocabularies without a padding token (GPT-2's).
    ``bias=False`` drops every bias, in the linear layers (q, k, v included) and the
    LayerNorms: nanoGPT's default block, a little faster; GPT-2 has them (True).

    The modern decoder's fields: ``positional="rope"`` with ``rope_theta``, ``norm``
    ("layer" or "rms"), ``activation="swiglu"``, ``num_kv_heads`` (None: one per head).
    ``norm_eps`` is the norms' epsilon; ``layer_norm_eps`` is its older name, kept equal
    to it (a config giving only one sets both).

    The pretrained families with parts of their own (Llama, Qwen, Gemma, GPT-NeoX, OPT)
    have configs of their own in ``models/families/``; ``GPT`` runs any of them, and
    ``from_dict`` reads a saved one back by its ``family``.
    """

    vocab_size: int
    max_len: int = 256
    d_model: int = 384
    num_heads: int = 6
    num_layers: int = 6
    d_ff: int | None = None  # type: ignore[assignment]  # None: 4 · d_model, set when built
    activation: Activation = "gelu"
    norm_first: bool = True
    positional: Positional = "learned"
    tie_weights: bool = True
    norm_eps: float | None = None
    num_kv_heads: int | None = None
    rope_theta: float = 10000.0

    family: ClassVar[str] = "gpt"
    EXTRA_POSITIONAL: ClassVar[tuple[str, ...]] = ("rope",)
    PRESETS: ClassVar[dict] = {
        # nanoGPT's CPU config: 4 layers, 4 heads, 128 wide, context 64.
        "tiny": dict(max_len=64, d_model=128, num_heads=4, num_layers=4, dropout=0.0),
        # nanoGPT's shakespeare-char config: 6 layers, 6 heads, 384 wide, context 256.
        "small": dict(max_len=256, d_model=384, num_heads=6, num_layers=6, dropout=0.2),
        # GPT-2 small's shape.
        "base": dict(max_len=1024, d_model=768, num_heads=12, num_layers=12),
        # The modern (Llama/SmolLM2) block at the tiny size: RoPE, RMSNorm, SwiGLU, GQA.
        "llama-tiny": dict(
            max_len=256,
            d_model=128,
            num_heads=4,
            num_kv_heads=2,
            num_layers=4,
            d_ff=344,
            dropout=0.0,
            positional="rope",
            norm="rms",
            norm_eps=1e-5,
            activation="swiglu",
            bias=False,
            qkv_bias=False,
            tie_weights=True,
        ),
    }

    def __post_init__(self) -> None:
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model
        if self.norm_eps is None:
            self.norm_eps = self.layer_norm_eps
        self.layer_norm_eps = self.norm_eps
        self._check()
        if self.num_kv_heads is not None and (
            self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads
        ):
            raise ValueError(
                f"num_kv_heads must be a positive divisor of num_heads={self.num_heads}, "
                f"got {self.num_kv_heads}"
            )
        head_dim = self.head_dim or self.d_model // self.num_heads
        if self.positional == "rope" and head_dim % 2:
            raise ValueError("positional='rope' needs an even head width")
        check_finite("rope_theta", self.rope_theta, minimum=0.0, above=True)
        if self.pad_id is not None and not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(
                f"pad_id={self.pad_id} is outside the vocabulary [0, {self.vocab_size})"
            )

    def parts(self) -> dict[str, Any]:
        """The keyword arguments of ``Backbone`` (``models.parts.decoder_only``)."""
        return parts.decoder_only(self)

    def readout(self) -> Readout:
        return Readout()

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Any:
        """The config ``values`` describe: this class's, or (``"family"`` other than
        "gpt") that family's; a config saved before the families had files of their own
        is read as the family its fields describe (``families.legacy``)."""
        family = values.get("family", "gpt")
        upgraded = (
            DecoderConfig.from_dict(values)
            if family != "gpt"
            else legacy.upgrade({k: v for k, v in values.items() if k != "family"})
        )
        if isinstance(upgraded, DecoderConfig) and cls is not GPTConfig:
            raise ValueError(f"{cls.__name__} is built on the textbook GPT, not {upgraded.title}")
        if isinstance(upgraded, DecoderConfig):
            return upgraded
        return super().from_dict(upgraded)


@dataclass(kw_only=True)
class GPTClassifierConfig(GPTConfig):
    """Configuration of ``GPTClassifier``: a GPT's shape, and a head on its last real token
    (``pooling="last"``: the only position that has read the whole text) or on the mean of
    its states (``"mean"``).

    ``decoder``: a pretrained family's config (its ``to_dict()``: SmolLM2's Llama, a Qwen)
    whose blocks the classifier runs instead of the parts this config names; the shape
    fields then repeat the family's."""

    num_classes: int = 2
    pooling: Literal["last", "mean"] = "last"
    decoder: dict[str, Any] | None = None

    # "small" is the IMDb classifier of `make demo` (two causal blocks 128 wide, no dropout):
    # the best GPT-shaped recipe measured within 10 CPU minutes (docs: BERT vs GPT).
    PRESETS: ClassVar[dict] = {
        **GPTConfig.PRESETS,
        "small": dict(max_len=256, d_model=128, num_heads=4, num_layers=2, d_ff=256, dropout=0.0),
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be at least 2, got {self.num_classes}")
        if self.pooling not in ("last", "mean"):
            raise ValueError(f"pooling must be 'last' or 'mean', got {shown(self.pooling)}")
        if self.decoder is not None:
            DecoderConfig.from_dict(self.decoder)  # a family it names, fields it has

    def parts(self) -> dict[str, Any]:
        """The textbook parts, or the pretrained family's (``decoder``)."""
        if self.decoder is None:
            return super().parts()
        return DecoderConfig.from_dict(self.decoder).parts()

    @classmethod
    def from_family(cls, family: DecoderConfig, **options: Any) -> GPTClassifierConfig:
        """A classifier on ``family``'s blocks (``options``: ``num_classes``, ``pooling``)."""
        shape = {name: getattr(family, name) for name in FAMILY_SHAPE}
        return cls(**shape, decoder=family.to_dict(), **options)


# the fields a classifier on a family's blocks repeats from the family's config
FAMILY_SHAPE = ("vocab_size", "max_len", "d_model", "num_heads", "num_kv_heads", "head_dim",
                "num_layers", "d_ff", "dropout", "attention_dropout", "pad_id")  # fmt: skip
