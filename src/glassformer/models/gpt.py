"""A decoder-only language model: the GPT-2 block by default, the modern (Llama) one by config.

ids (B, T) → token + learned position embeddings → causal pre-norm blocks → final
LayerNorm → lm_head (tied to the token embedding) → logits (B, T, V).

The backbone (``models.backbone``) runs the embeddings, the blocks and the final norm; the
config chooses them (``config.parts()``): the textbook decoder's ``GPTConfig``
(``models/families/gpt.py``), whose modern preset is the same assembly with other parts
(``positional="rope"``, ``norm="rms"``, ``activation="swiglu"``, grouped-query attention:
``"llama-tiny"``), or a pretrained family's config (``models/families/``).

Reading order of one forward: this file, ``models/backbone.py``, ``modules/block.py``,
``modules/attention.py`` (and ``modules/sdpa.py``), ``modules/feedforward.py``,
``modules/norms.py``, ``modules/position.py``.
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
from torch import Tensor, nn

from glassformer.generation import GenerationConfig, gpt_generate
from glassformer.models.backbone import Backbone
from glassformer.models.base import ModelOutput
from glassformer.models.common import cross_entropy
from glassformer.models.families import DecoderConfig
from glassformer.models.families.gpt import GPTClassifierConfig, GPTConfig
from glassformer.modules.attention import MultiHeadAttention
from glassformer.modules.block import Block
from glassformer.modules.cache import DecoderCache
from glassformer.modules.hooks import HookPoint
from glassformer.modules.position import TokenEmbedding
from glassformer.modules.sdpa import key_mask


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
        self.lm_head = nn.Linear(width, config.vocab_size, bias=readout.bias)
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


__all__ = ["GPT", "GPTClassifierConfig", "GPTConfig", "init_gpt_weights"]
