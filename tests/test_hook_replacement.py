"""Every hook point's replacement takes effect, in every model kind.

For each hook point of each kind, a hook adds a known perturbation to the value there; the
value at the next hook point the forward pass reaches is then compared with what the step
between the two computes from the perturbed value, recomputed here from the modules' own
weights (a small reference of each step: a norm, a projection, a rotation, the scores, the
softmax, the weighted sum, a residual sum, the MLP, a pooling, a head). An implementation
that calls a hook but keeps the old value (a pattern replaced and then ignored) fails here:
the next value would still be the unperturbed one's.
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch
import torch.nn.functional as F

from glassformer import (
    GPT,
    BertClassifier,
    BertClassifierConfig,
    BertConfig,
    BertEncoder,
    ClassifierConfig,
    EncoderLM,
    EncoderLMConfig,
    GPTClassifier,
    GPTClassifierConfig,
    GPTConfig,
    SentenceConfig,
    SentenceEncoder,
    Seq2SeqConfig,
    Seq2SeqTransformer,
    TransformerClassifier,
    VisionTransformer,
    ViTConfig,
)
from glassformer.models.common import pool
from glassformer.modules.feedforward import GatedFeedForward
from glassformer.modules.norms import RMSNorm
from glassformer.modules.rotary import RotaryEmbedding

V = 40
SHAPE = dict(d_model=32, num_heads=4, num_layers=2, d_ff=64, dropout=0.0)


def kinds() -> dict:
    """One small model of every kind (eval mode, random weights) and its inputs; padding in
    the second row where the model reads token ids with a pad id."""
    torch.manual_seed(0)
    ids = torch.randint(1, V, (2, 9))
    ids[1, -2:] = 0
    unpadded = ids.clamp(min=1)
    gpt = dict(vocab_size=V, max_len=32, **SHAPE)
    translator = dict(src_vocab_size=V, tgt_vocab_size=V, max_len=32, d_model=32, num_heads=4,
                      num_encoder_layers=2, num_decoder_layers=2, d_ff=64, dropout=0.0)  # fmt: skip
    bert = dict(vocab_size=V, max_len=32, attention_dropout=0.0, **SHAPE)
    modern = GPTConfig.preset("llama-tiny", vocab_size=V, max_len=32, d_model=32, d_ff=48)
    made = {
        "gpt": (GPT(GPTConfig(**gpt, pad_id=None)), (unpadded,)),
        "modern gpt": (GPT(modern), (unpadded,)),
        "windowed gpt": (GPT(GPTConfig(**gpt, attention_window=3, global_tokens=1)), (ids,)),
        "gpt classifier": (GPTClassifier(GPTClassifierConfig(**gpt, num_classes=3)), (ids,)),
        "classifier": (
            TransformerClassifier(
                ClassifierConfig(vocab_size=V, num_classes=3, max_len=32, **SHAPE)
            ),
            (ids,),
        ),  # fmt: skip
        "encoder lm": (EncoderLM(EncoderLMConfig(vocab_size=V, max_len=32, **SHAPE)), (ids,)),
        "bert": (BertEncoder(BertConfig(**bert)), (ids,)),
        "bert classifier": (BertClassifier(BertClassifierConfig(**bert, num_classes=3)), (ids,)),
        "sentence": (SentenceEncoder(SentenceConfig(**bert, max_tokens=16)), (ids,)),
        "translator": (Seq2SeqTransformer(Seq2SeqConfig(**translator)), (ids, unpadded[:, :7])),
        "pre-norm translator": (
            Seq2SeqTransformer(Seq2SeqConfig(**translator, norm_first=True)),
            (ids, unpadded[:, :7]),
        ),
        "vit": (
            VisionTransformer(ViTConfig(image_size=8, patch_size=2, num_classes=3, **SHAPE)),
            (torch.rand(2, 1, 8, 8),),
        ),
    }
    return {kind: (model.eval(), inputs) for kind, (model, inputs) in made.items()}


KINDS = kinds()


def perturbation(value: torch.Tensor, name: str) -> torch.Tensor:
    """A fixed random change, half the value's spread (its masked scores left out)."""
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    real = value[value > torch.finfo(value.dtype).min / 2]
    scale = 0.5 * float(real.std()) if real.numel() > 1 else 0.5
    return torch.randn(value.shape, generator=g) * max(scale, 1e-2)


def run(model, inputs, name: str | None):
    """The cache of every hook point (the per-head results too), with ``name`` perturbed."""
    values = {}

    def keep(value, n):
        values[n] = value.detach().clone()

    hooks = [] if name is None else [(name, lambda v, n: v + perturbation(v, n))]
    with torch.no_grad():
        model.run_with_hooks(*inputs, hooks=[*hooks, (None, keep)])
    return values


def test_the_reference_of_every_step_reproduces_the_unperturbed_run():
    """Without a change, each point's next value is what the reference step computes from it:
    the reference is right, so a mismatch below is the model ignoring a replacement."""
    for kind, (model, inputs) in KINDS.items():
        cache = run(model, inputs, None)
        for name in cache:
            for nxt, expected in next_values(model, name, cache):
                torch.testing.assert_close(
                    cache[nxt], expected, atol=1e-4, rtol=1e-4, msg=f"{kind}: {name} → {nxt}"
                )


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_replacement_changes_the_next_value_as_the_step_computes(kind):
    model, inputs = KINDS[kind]
    plain = run(model, inputs, None)
    checked = 0
    for name in model.hook_names():
        cache = run(model, inputs, name)
        for nxt, expected in next_values(model, name, cache):
            msg = f"{kind}: {name} replaced → {nxt}"
            torch.testing.assert_close(cache[nxt], expected, atol=1e-4, rtol=1e-4, msg=msg)
            assert not torch.allclose(cache[nxt], plain[nxt], atol=1e-3), f"{msg}: no change"
            checked += 1
    outputs = {"hook_logits", "hook_resid_post", "ln_final.hook_normalized"}
    unchecked = [
        n for n in model.hook_names()
        if not next_values(model, n, plain) and not n.endswith(tuple(outputs))
    ]  # fmt: skip
    assert not unchecked and checked > 30


# ---- the reference: the step from each hook point to the next one ------------------------


def next_values(model, name: str, cache: dict) -> list[tuple[str, torch.Tensor]]:
    """The hook points the value at ``name`` feeds directly, with what each must hold:
    [(next name, expected value)], computed from ``cache`` and the modules' weights."""
    modules = dict(model.named_modules())
    parent, _, leaf = name.rpartition(".")
    owner = modules[parent]
    if ".blocks." in f".{name}" and leaf != "hook_logits":
        return _in_block(model, modules, name, cache)
    return _outside_blocks(model, modules, name, cache, owner)


def _stack_of(name: str) -> str:
    """ "decoder." for a translator's decoder's points, "encoder." for its encoder's, else ""."""
    return name.split(".")[0] + "." if name.startswith(("encoder.", "decoder.")) else ""


def _norm(module, x):
    if isinstance(module, RMSNorm):
        x32 = x.float()
        return module.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + module.eps))
    return F.layer_norm(x, x.shape[-1:], module.weight, module.bias, module.eps)


def _project(attn, x, which: str) -> torch.Tensor:
    """x (B, T, D) through the q, k or v rows of ``qkv_proj``: (B, T, heads, Dh)."""
    H, Hkv, Dh = attn.num_heads, attn.num_kv_heads, attn.head_dim
    start = {"q": 0, "k": H * Dh, "v": (H + Hkv) * Dh}[which]
    width = (H if which == "q" else Hkv) * Dh
    W, b = attn.qkv_proj.weight, attn.qkv_proj.bias
    y = F.linear(x, W[start : start + width], None if b is None else b[start : start + width])
    return y.view(*x.shape[:2], -1, Dh)


def _rotate(model, x, stack: str) -> torch.Tensor:
    """Per-head values (B, T, heads, Dh) turned by their positions 0..T-1 (RoPE)."""
    rotary = (model.decoder if stack == "decoder." else model).rotary
    angles = rotary.cos_sin(torch.arange(x.size(1)), x.dtype)
    return RotaryEmbedding.rotate(x.transpose(1, 2), angles).transpose(1, 2)


def _attention_steps(model, attn, at: str, leaf: str, cache: dict, stack: str):
    """The steps inside one attention module at ``at`` (its hook names' prefix)."""
    H, Hkv = attn.num_heads, attn.num_kv_heads
    rotated = f"{at}hook_rot_q" in cache
    q = cache[f"{at}hook_rot_q" if rotated else f"{at}hook_q"]
    k = cache[f"{at}hook_rot_k" if rotated else f"{at}hook_k"]
    scores = cache[f"{at}hook_attn_scores"]
    masked = scores == torch.finfo(scores.dtype).min  # where the mask put the lowest float

    def scores_of(q, k):
        k = k.repeat_interleave(H // Hkv, 2)
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.size(-1))
        return s.masked_fill(masked, torch.finfo(s.dtype).min)

    def z_of(pattern, v):
        return torch.einsum("bhqk,bkhd->bqhd", pattern, v.repeat_interleave(H // Hkv, 2))

    if leaf in ("hook_q", "hook_k") and rotated:
        return [(f"{at}hook_rot_{leaf[-1]}", _rotate(model, cache[at + leaf], stack))]
    if leaf in ("hook_q", "hook_rot_q"):
        return [(f"{at}hook_attn_scores", scores_of(cache[at + leaf], k))]
    if leaf in ("hook_k", "hook_rot_k"):
        return [(f"{at}hook_attn_scores", scores_of(q, cache[at + leaf]))]
    if leaf == "hook_attn_scores":
        pattern = cache[at + leaf].softmax(-1).masked_fill(masked, 0.0)
        return [(f"{at}hook_pattern", pattern)]
    if leaf == "hook_pattern":
        return [(f"{at}hook_z", z_of(cache[at + leaf], cache[f"{at}hook_v"]))]
    if leaf == "hook_v":
        return [(f"{at}hook_z", z_of(cache[f"{at}hook_pattern"], cache[at + leaf]))]
    return []


def _in_block(model, modules, name: str, cache: dict):
    stack = _stack_of(name)
    i = int(name[len(stack) :].split(".")[1])
    at = f"{stack}blocks.{i}."
    block = modules[at[:-1]]
    leaf = name[len(at) :]
    part = leaf.split(".")[0]
    if part in ("attn", "cross_attn"):
        attn = getattr(block, part)
        sub = leaf.split(".")[1]
        if sub == "hook_z":
            out = "hook_attn_out" if part == "attn" else "hook_cross_attn_out"
            z = cache[name]
            return [(at + out, attn.out_proj(z.reshape(*z.shape[:2], -1)))]
        if sub == "hook_result":
            out = "hook_attn_out" if part == "attn" else "hook_cross_attn_out"
            bias = attn.out_proj.bias
            return [(at + out, cache[name].sum(2) + (0 if bias is None else bias))]
        return _attention_steps(model, attn, f"{at}{part}.", sub, cache, stack)
    if part == "mlp":
        return _mlp_steps(block.mlp, at, leaf, cache)
    return _stream_steps(model, modules, block, at, leaf, cache, i, stack)


def _mlp_steps(mlp, at: str, leaf: str, cache: dict):
    gated = isinstance(mlp, GatedFeedForward)
    if leaf in ("mlp.hook_pre", "mlp.hook_pre_linear"):
        pre = cache[f"{at}mlp.hook_pre"]
        post = F.silu(pre) * cache[f"{at}mlp.hook_pre_linear"] if gated else F.gelu(pre)
        if not gated and mlp.activation == "relu":
            post = F.relu(pre)
        return [(f"{at}mlp.hook_post", post)]
    if leaf == "mlp.hook_post":
        down = mlp.down_proj if gated else mlp.linear2
        return [(f"{at}hook_mlp_out", down(cache[at + leaf]))]
    return []


def _sublayer_input(block, at: str, norm: str, x, cache: dict):
    """What a sub-layer reads: its norm's output under pre-norm (the next point is that
    norm), the stream itself under post-norm."""
    if block.norm_first:
        return [(f"{at}{norm}.hook_normalized", _norm(getattr(block, norm), x))]
    return None


def _first_of(block, at: str, which: str, x, cache: dict):
    """The first points a sub-layer reading ``x`` fills: q (and k, v) of an attention, or
    the MLP's first projection(s)."""
    if which in ("attn", "cross_attn"):
        attn = getattr(block, which)
        if which == "cross_attn":  # the query only: k and v come from the memory
            return [(f"{at}cross_attn.hook_q", _project(attn, x, "q"))]
        return [(f"{at}attn.hook_{w}", _project(attn, x, w)) for w in "qkv"]
    mlp = block.mlp
    if isinstance(mlp, GatedFeedForward):
        return [
            (f"{at}mlp.hook_pre", mlp.gate_proj(x)),
            (f"{at}mlp.hook_pre_linear", mlp.up_proj(x)),
        ]
    return [(f"{at}mlp.hook_pre", mlp.linear1(x))]


def _stream_steps(model, modules, block, at, leaf, cache, i, stack):
    x = cache[at + leaf]
    post = not block.norm_first
    crossed = block.cross_attn is not None
    after_attn = "ln_cross" if crossed else "ln2"
    sub_after_attn = "cross_attn" if crossed else "mlp"
    if leaf == "hook_resid_pre":
        return _sublayer_input(block, at, "ln1", x, cache) or _first_of(block, at, "attn", x, cache)
    if leaf == "ln1.hook_normalized":
        return [(at + "hook_resid_mid", x)] if post else _first_of(block, at, "attn", x, cache)
    if leaf == "hook_attn_out":
        total = cache[at + "hook_resid_pre"] + x
        return [(at + "ln1.hook_normalized", _norm(block.ln1, total))] if post else [
            (at + "hook_resid_mid", total)
        ]  # fmt: skip
    if leaf == "hook_resid_mid":
        return _sublayer_input(block, at, after_attn, x, cache) or _first_of(
            block, at, sub_after_attn, x, cache
        )
    if leaf == "ln_cross.hook_normalized":
        return [(at + "hook_resid_mid_cross", x)] if post else _first_of(
            block, at, "cross_attn", x, cache
        )  # fmt: skip
    if leaf == "hook_cross_attn_out":
        total = cache[at + "hook_resid_mid"] + x
        return [(at + "ln_cross.hook_normalized", _norm(block.ln_cross, total))] if post else [
            (at + "hook_resid_mid_cross", total)
        ]  # fmt: skip
    if leaf == "hook_resid_mid_cross":
        return _sublayer_input(block, at, "ln2", x, cache) or _first_of(block, at, "mlp", x, cache)
    if leaf == "ln2.hook_normalized":
        return [(at + "hook_resid_post", x)] if post else _first_of(block, at, "mlp", x, cache)
    if leaf == "hook_mlp_out":
        before = cache[at + ("hook_resid_mid_cross" if crossed else "hook_resid_mid")]
        total = before + x
        return [(at + "ln2.hook_normalized", _norm(block.ln2, total))] if post else [
            (at + "hook_resid_post", total)
        ]  # fmt: skip
    if leaf == "hook_resid_post":
        return _after_stack(model, modules, stack, i, x, cache)
    return []


def _after_stack(model, modules, stack: str, i: int, x, cache: dict):
    """Where a block's output goes: the next block, the final norm, or past the stack."""
    if f"{stack}blocks.{i + 1}.hook_resid_pre" in cache:
        return [(f"{stack}blocks.{i + 1}.hook_resid_pre", x)]
    body = modules[stack[:-1]] if stack else model
    if body.ln_final is not None:
        return [(f"{stack}ln_final.hook_normalized", _norm(body.ln_final, x))]
    return _past_the_stack(model, stack, x, cache)


def _past_the_stack(model, stack: str, x, cache: dict):
    """What reads a stack's last states: the memory's keys and values of every
    cross-attention (a translator's encoder), a pooling, a vocabulary head."""
    if stack == "encoder.":
        found = []
        for j, block in enumerate(model.decoder.blocks):
            at = f"decoder.blocks.{j}.cross_attn."
            found += [(at + "hook_k", _project(block.cross_attn, x, "k"))]
            found += [(at + "hook_v", _project(block.cross_attn, x, "v"))]
        return found
    if "hook_pooled" in cache:
        mask = None if model.kind == "vit" else _real(model, cache)
        return [("hook_pooled", pool(x, mask, model.config.pooling))]
    head = getattr(model, "lm_head", None) or getattr(model, "output_proj", None)
    return [("hook_logits", head(x))] if head is not None else []


def _real(model, cache):
    """Which positions are real tokens: the test's second row ends in two pads."""
    B, T = cache["hook_embed"].shape[:2]
    real = torch.ones(B, 1, 1, T, dtype=torch.bool)
    if model.config.pad_id is not None:
        real[1, ..., -2:] = False
    return real


def _outside_blocks(model, modules, name: str, cache: dict, owner):
    stack = _stack_of(name)
    leaf = name[len(stack) :]
    if leaf in ("hook_embed", "hook_pos_embed"):
        x = cache[f"{stack}hook_embed"] + cache.get(f"{stack}hook_pos_embed", 0)
        body = modules[stack[:-1]] if stack else model
        if body.token_type is not None:
            x = x + body.token_type.weight[0]  # segment 0 everywhere
            return [(f"{stack}ln_embed.hook_normalized", _norm(body.ln_embed, x))]
        if getattr(model, "cls_token", None) is not None:
            x = torch.cat([model.cls_token.expand(x.size(0), -1, -1), x], dim=1)
        return [(f"{stack}blocks.0.hook_resid_pre", x)]
    if leaf == "ln_embed.hook_normalized":
        return [(f"{stack}blocks.0.hook_resid_pre", cache[name])]
    if leaf == "ln_final.hook_normalized":
        return _past_the_stack(model, stack, cache[name], cache)
    if leaf == "hook_pooled":
        return [("hook_logits", model.head(cache[name]))]
    return []
