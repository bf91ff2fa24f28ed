"""A decoder-only language model: the GPT-2 block by default, the modern (Llama) one by config.

ids (B, T) → token + learned position embeddings → causal pre-norm blocks → final
LayerNorm → lm_head (tied to the token embedding) → logits (B, T, V).

The backbone (``models.backbone``) runs the embeddings, the blocks and the final norm; the
builder ``models.parts.decoder_only`` chooses them from the config. The modern decoder is
the same assembly with other parts: ``positional="rope"`` (rotary q/k, no position table),
``norm="rms"``, ``activation="swiglu"``, ``num_kv_heads`` < ``num_heads`` (grouped-query
attention), ``bias=False`` and often ``tie_weights=False`` (the ``"llama-tiny"`` preset).

Reading order of one forward: this file, ``models/backbone.py``, ``modules/block.py``,
``modules/attention.py`` (and ``modules/sdpa.py``), ``modules/feedforward.py``,
``modules/norms.py``, ``modules/position.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, cast

import torch
from torch import Tensor, nn

from glassformer.errors import shown
from glassformer.generation import GenerationConfig, gpt_generate
from glassformer.models import parts
from glassformer.models.backbone import Backbone
from glassformer.models.base import (
    Activation,
    ModelConfig,
    ModelOutput,
    Positional,
    check_finite,
)
from glassformer.models.common import cross_entropy
from glassformer.models.families import DecoderConfig, Readout, legacy
from glassformer.modules.attention import MultiHeadAttention
from glassformer.modules.block import Block
from glassformer.modules.cache import DecoderCache
from glassformer.modules.hooks import HookPoint
from glassformer.modules.masks import key_mask
from glassformer.modules.position import TokenEmbedding


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


class GPT(Backbone):
    """Decoder-only Transformer language model: a causal ``Backbone`` and a vocabulary head."""

    kind = "gpt"
    config_class = GPTConfig
    config: GPTConfig | DecoderConfig
    embed: TokenEmbedding
    HEADS = ("lm_head",)

    def __init__(self, config: GPTConfig | DecoderConfig) -> None:
        """``config``: the textbook decoder's (``GPTConfig``) or a family's
        (``models.families``), whose parts this model runs."""
        super().__init__(config, **config.parts())
        readout = config.readout()
        width = readout.embed_width or config.d_model
        self.project_out = (
            None if readout.embed_width is None else nn.Linear(config.d_model, width, bias=False)
        )
        self.final_softcap = readout.softcap  # logits = c·tanh(logits / c) (Gemma)
        self.lm_head = nn.Linear(width, config.vocab_size, bias=False)
        self.hook_logits = HookPoint()  # (B, T, V)
        init_gpt_weights(self, config.num_layers)
        if config.tie_weights:
            self.tie_weights()

    def tie_weights(self) -> None:
        """The output head reads the token embedding (one Parameter for both)."""
        self.lm_head.weight = self.embed.weight

    def forward(  # type: ignore[override]
        self,
        ids: Tensor,
        *,
        labels: Tensor | None = None,
        mask: Tensor | None = None,
        attention_mask: Tensor | None = None,
        need_weights: bool = False,
        cache: DecoderCache | None = None,
        positions: Tensor | None = None,
        logits_to_keep: int = 0,
    ) -> ModelOutput:
        """Next-token logits for every position (or the last ``logits_to_keep``).

        Args:
            ids: token ids (B, T), T ≤ ``max_len``.
            labels: the token that should follow each position (B, T), already shifted;
                positions labelled ``pad_id`` (or -100 without a pad id) are ignored.
            mask: key mask (B, 1, 1, Tk), True = real token; built from ``pad_id`` if None
                (and neither a cache nor ``attention_mask`` is given). Causality is always
                applied.
            attention_mask: Hugging Face's (B, Tk) of 1 (real token) / 0 (padding), instead
                of ``mask``; with a cache it covers the cached tokens and then ``ids``, as
                in Hugging Face. It masks keys only: positions still count from the cache
                (pass ``positions`` for a left-padded batch, as ``generate`` does).
            need_weights: return every layer's (B, H, T, Tk) attention weights.
            cache: from ``new_cache()``: the keys/values of the tokens already seen, which
                ``ids`` continue (Tk = cached + T). It is updated in place. With a cache,
                ``mask`` must cover the cached keys too.
            positions: each token's position (B, T); by default they follow on from the
                cache (0, 1, 2, ... without one). A left-padded batch passes its own.
            logits_to_keep: the logits of the last this many positions only (0: all), as
                generation needs after a prompt: the vocabulary head is the largest matmul.
        """
        if logits_to_keep and labels is not None:
            raise ValueError("logits_to_keep leaves out logits that labels score")
        # With a cache, pads are not guessed from ids: a mask must cover the cached keys too.
        pad_id = self.config.pad_id if cache is None else None
        cached = cache.length if cache is not None and attention_mask is not None else 0
        mask = key_mask(ids, pad_id, mask, attention_mask, cached=cached)
        x, attentions, _ = super().forward(
            ids, mask, need_weights=need_weights, cache=cache, positions=positions
        )
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        logits = self.hook_logits(self.unembed(x))  # (B, T, V)
        loss = None if labels is None else cross_entropy(logits, labels, self.config.pad_id)
        return ModelOutput(logits, loss, decoder_attentions=attentions)

    def unembed(self, x: Tensor) -> Tensor:
        """Final states (…, D) → logits (…, V): the vocabulary head, and the soft cap
        c·tanh(logits / c) where the config has one (Gemma). The logit lens reads through it."""
        if self.project_out is not None:  # OPT-350m: back to the embeddings' width
            x = self.project_out(x)
        logits = self.lm_head(x)
        cap = self.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def new_cache(self) -> DecoderCache:
        """An empty key/value cache for incremental decoding with ``forward(..., cache=)``."""
        reach: list[int | None] = []  # each layer's reach back (None: every key)
        global_tokens = 0
        for block in self.blocks:
            attn = cast(MultiHeadAttention, cast(Block, block).attn)
            reach.append(None if attn.window is None else attn.window[0])
            global_tokens = max(global_tokens, attn.global_tokens)
        return DecoderCache(len(reach), windows=reach, global_tokens=global_tokens)

    @torch.no_grad()
    def generate(
        self,
        input_ids: Tensor,
        max_new_tokens: int,
        *,
        generation_config: GenerationConfig | None = None,
        **kwargs: Any,
    ) -> Tensor:
        """Continue ``input_ids`` (B, T); returns the prompt followed by the new tokens.

        The options come as a ``GenerationConfig`` and/or keywords that override its
        fields (``do_sample=True``, ``top_k=50``, ``eos_id=...``), beside the per-call
        ``attention_mask``, ``generator`` and ``streamer``. See
        ``glassformer.generation.gpt_generate``.
        """
        return gpt_generate(
            self, input_ids, max_new_tokens, generation_config=generation_config, **kwargs
        )


def init_gpt_weights(model: nn.Module, num_layers: int) -> None:
    """GPT-2's initialisation: N(0, 0.02) for every matrix and embedding, zero biases, and
    the projections that write into the residual stream shrunk by √(2 · layers)."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    for name, p in model.named_parameters():
        if name.endswith(("out_proj.weight", "linear2.weight", "down_proj.weight")):
            nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * num_layers))


@dataclass(kw_only=True)
class GPTClassifierConfig(GPTConfig):
    """Configuration of ``GPTClassifier``: a GPT's shape, and a head on its last real token
    (``pooling="last"``: the only position that has read the whole text) or on the mean of
    its states (``"mean"``)."""

    num_classes: int = 2
    pooling: Literal["last", "mean"] = "last"

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
