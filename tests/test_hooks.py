"""Hook points, run_with_cache and run_with_hooks: every cached value equals a recomputation
from the weights, identity hooks change nothing (bit for bit), a hook can replace a value,
and the fused attention kernel stays in use unless scores or weights are asked for."""

import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from glassformer import (
    GPT,
    BertConfig,
    BertEncoder,
    ClassifierConfig,
    EncoderLM,
    EncoderLMConfig,
    GPTConfig,
    Seq2SeqConfig,
    Seq2SeqTransformer,
    TransformerClassifier,
    VisionTransformer,
    ViTConfig,
)
from glassformer.modules.hooking import ActivationCache, hook_points

V = 40


def gpt(modern: bool = False) -> GPT:
    torch.manual_seed(0)
    if modern:
        config = GPTConfig.preset("llama-tiny", vocab_size=V, max_len=32, d_model=32, d_ff=48)
    else:
        config = GPTConfig(vocab_size=V, max_len=32, d_model=32, num_heads=4, num_layers=2,
                           dropout=0.0, pad_id=None)  # fmt: skip
    return GPT(config).eval()


def models() -> dict:
    """One small model of every kind, with the inputs its forward takes."""
    torch.manual_seed(0)
    ids = torch.randint(1, V, (2, 9))
    ids[1, -2:] = 0  # padding in the second row (pad_id 0 for the encoders)
    shape = dict(d_model=32, num_heads=4, num_layers=2, d_ff=64, dropout=0.0)
    seq2seq = Seq2SeqTransformer(
        Seq2SeqConfig(src_vocab_size=V, tgt_vocab_size=V, max_len=32, d_model=32, num_heads=4,
                      num_encoder_layers=2, num_decoder_layers=2, d_ff=64, dropout=0.0)
    )  # fmt: skip
    return {
        "gpt": (gpt(), (ids.clamp(min=1),)),
        "modern gpt": (gpt(modern=True), (ids.clamp(min=1),)),
        "classifier": (
            TransformerClassifier(
                ClassifierConfig(vocab_size=V, num_classes=3, max_len=32, **shape)
            ),
            (ids,),
        ),
        "encoder lm": (EncoderLM(EncoderLMConfig(vocab_size=V, max_len=32, **shape)), (ids,)),
        "bert": (BertEncoder(BertConfig(vocab_size=V, max_len=32, **shape)), (ids,)),
        "translator": (seq2seq, (ids, torch.randint(1, V, (2, 7)))),
        "vit": (
            VisionTransformer(ViTConfig(image_size=8, patch_size=2, num_classes=3, **shape)),
            (torch.rand(2, 1, 8, 8),),
        ),
    }


def first(output):
    """The main tensor of any model's output."""
    return output.logits if hasattr(output, "logits") else output.hidden


@pytest.mark.parametrize("kind", list(models()))
def test_identity_hooks_on_every_point_change_no_bit(kind):
    """Hooks that return what they get change nothing, bit for bit: on the fused path when
    no score or weight is asked for, on the readable path (as need_weights takes it) when
    they are. Per-head results make the output a sum over heads: equal to rounding."""
    model, inputs = models()[kind]
    model.eval()
    plain = first(model(*inputs))
    fused = lambda n: not n.endswith(("hook_attn_scores", "hook_pattern", "hook_result"))  # noqa: E731
    hooked = first(model.run_with_hooks(*inputs, hooks=[(fused, lambda v, n: v)]))
    assert torch.equal(hooked, plain)
    readable = first(model(*inputs, need_weights=True))
    no_result = lambda n: not n.endswith("hook_result")  # noqa: E731
    all_points = first(model.run_with_hooks(*inputs, hooks=[(no_result, lambda v, n: v.clone())]))
    assert torch.equal(all_points, readable)
    with_results = first(model.run_with_hooks(*inputs, hooks=[(None, lambda v, n: v)]))
    torch.testing.assert_close(with_results, plain, atol=1e-5, rtol=0)


def test_every_kind_has_the_same_suffixes():
    suffixes = {}
    for kind, (model, _) in models().items():
        suffixes[kind] = {name.rsplit(".", 1)[-1] for name in model.hook_names()}
    core = {
        *("hook_embed", "hook_pos_embed", "hook_normalized", "hook_logits"),
        *("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out"),
        *("hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z"),
        *("hook_result", "hook_pre", "hook_post"),
    }
    for kind, found in suffixes.items():
        # rotary positions are not added to the stream; a bare encoder has no logits
        absent = {"modern gpt": {"hook_pos_embed"}, "bert": {"hook_logits"}}.get(kind, set())
        missing = core - found - absent
        assert not missing, (kind, missing)
    assert {"hook_cross_attn_out", "hook_resid_mid_cross"} <= suffixes["translator"]
    assert {"hook_rot_q", "hook_rot_k", "hook_pre_linear"} <= suffixes["modern gpt"]


@pytest.mark.parametrize("modern", [False, True])
def test_cached_values_equal_a_recomputation_from_the_weights(modern):
    """Layer by layer, from the embeddings to the logits, with the weights alone."""
    model = gpt(modern)
    c = model.config
    ids = torch.randint(1, V, (2, 10))  # no padding (the modern preset pads with 0)
    out, cache = model.run_with_cache(ids)
    H, Hkv, Dh, T = c.num_heads, c.num_kv_heads or c.num_heads, c.d_model // c.num_heads, 10

    def norm(module, x):
        if modern:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + module.eps) * module.weight
        return F.layer_norm(x, (c.d_model,), module.weight, module.bias, module.eps)

    x = model.embed.weight[ids]
    torch.testing.assert_close(cache["hook_embed"], x, rtol=0, atol=0)
    if not modern:
        pos = model.pos_embed.weight[:T]
        torch.testing.assert_close(cache["hook_pos_embed"], pos)
        x = x + pos
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i, layer in enumerate(model.blocks):
        at = f"blocks.{i}."
        torch.testing.assert_close(cache[at + "hook_resid_pre"], x, atol=1e-6, rtol=0)
        h = norm(layer.ln1, x)
        torch.testing.assert_close(cache[at + "ln1.hook_normalized"], h, atol=1e-5, rtol=0)
        attn = layer.attn
        W, b = attn.qkv_proj.weight, attn.qkv_proj.bias
        qkv = F.linear(h, W, b)
        q, k, v = qkv.split([H * Dh, Hkv * Dh, Hkv * Dh], dim=-1)
        q, k, v = q.view(2, T, H, Dh), k.view(2, T, Hkv, Dh), v.view(2, T, Hkv, Dh)
        for name, value in (("q", q), ("k", k), ("v", v)):
            torch.testing.assert_close(cache[at + f"attn.hook_{name}"], value, atol=1e-5, rtol=0)
        if modern:  # rotate pairs (i, i + Dh/2) by position × frequency
            inv = 1.0 / c.rope_theta ** (torch.arange(0, Dh, 2).float() / Dh)
            angle = torch.arange(T).float()[:, None] * inv  # (T, Dh/2)
            cos, sin = torch.cat([angle, angle], -1).cos(), torch.cat([angle, angle], -1).sin()

            def rotate(t, cos=cos, sin=sin):
                half = torch.cat([-t[..., Dh // 2 :], t[..., : Dh // 2]], -1)
                return t * cos[:, None] + half * sin[:, None]

            q, k = rotate(q), rotate(k)
            torch.testing.assert_close(cache[at + "attn.hook_rot_q"], q, atol=1e-5, rtol=0)
        k, v = k.repeat_interleave(H // Hkv, 2), v.repeat_interleave(H // Hkv, 2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(Dh)
        scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
        torch.testing.assert_close(cache[at + "attn.hook_attn_scores"], scores, atol=1e-5, rtol=0)
        pattern = scores.softmax(-1)
        torch.testing.assert_close(cache[at + "attn.hook_pattern"], pattern, atol=1e-6, rtol=0)
        z = torch.einsum("bhqk,bkhd->bqhd", pattern, v)
        torch.testing.assert_close(cache[at + "attn.hook_z"], z, atol=1e-5, rtol=0)
        attn_out = F.linear(z.reshape(2, T, H * Dh), attn.out_proj.weight, attn.out_proj.bias)
        torch.testing.assert_close(cache[at + "hook_attn_out"], attn_out, atol=1e-5, rtol=0)
        x = x + attn_out
        torch.testing.assert_close(cache[at + "hook_resid_mid"], x, atol=1e-5, rtol=0)
        h = norm(layer.ln2, x)
        ff = layer.mlp
        if modern:
            pre = F.linear(h, ff.gate_proj.weight)
            post = F.silu(pre) * F.linear(h, ff.up_proj.weight)
            mlp = F.linear(post, ff.down_proj.weight)
        else:
            pre = F.linear(h, ff.linear1.weight, ff.linear1.bias)
            post = F.gelu(pre)
            mlp = F.linear(post, ff.linear2.weight, ff.linear2.bias)
        torch.testing.assert_close(cache[at + "mlp.hook_pre"], pre, atol=1e-5, rtol=0)
        torch.testing.assert_close(cache[at + "mlp.hook_post"], post, atol=1e-5, rtol=0)
        torch.testing.assert_close(cache[at + "hook_mlp_out"], mlp, atol=1e-5, rtol=0)
        x = x + mlp
        torch.testing.assert_close(cache[at + "hook_resid_post"], x, atol=1e-5, rtol=0)
    final = norm(model.ln_final, x)
    torch.testing.assert_close(cache["ln_final.hook_normalized"], final, atol=1e-5, rtol=0)
    logits = final @ model.lm_head.weight.T
    torch.testing.assert_close(cache["hook_logits"], logits, atol=1e-4, rtol=0)
    assert torch.equal(cache["hook_logits"], out.logits)


def test_cross_attention_values_equal_a_recomputation():
    model, (src, tgt) = models()["translator"]
    model.eval()
    _, cache = model.run_with_cache(src, tgt)
    layer = model.decoder.blocks[1]
    memory = cache["encoder.ln_final.hook_normalized"] if model.encoder.ln_final else None
    memory = memory if memory is not None else cache["encoder.blocks.1.hook_resid_post"]
    attn, H, Dh = layer.cross_attn, 4, 8
    query = (
        cache["decoder.blocks.1.ln_cross.hook_normalized"]
        if layer.norm_first
        else (cache["decoder.blocks.1.hook_resid_mid"])
    )
    W, b = attn.qkv_proj.weight, attn.qkv_proj.bias
    q = F.linear(query, W[: H * Dh], b[: H * Dh]).view(2, 7, H, Dh)
    k = F.linear(memory, W[H * Dh : 2 * H * Dh], b[H * Dh : 2 * H * Dh]).view(2, 9, H, Dh)
    torch.testing.assert_close(cache["decoder.blocks.1.cross_attn.hook_q"], q, atol=1e-5, rtol=0)
    torch.testing.assert_close(cache["decoder.blocks.1.cross_attn.hook_k"], k, atol=1e-5, rtol=0)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(Dh)
    real = (src != 0)[:, None, None, :]  # the source's padding is masked
    pattern = scores.masked_fill(~real, torch.finfo(scores.dtype).min).softmax(-1)
    torch.testing.assert_close(
        cache["decoder.blocks.1.cross_attn.hook_pattern"], pattern, atol=1e-6, rtol=0
    )
    assert cache["decoder.blocks.1.cross_attn.hook_pattern"][1, :, :, -2:].abs().max() == 0


def test_zeroing_a_head_through_a_hook_equals_zeroing_its_output_columns():
    model = gpt()
    ids = torch.randint(0, V, (2, 10))
    layer, head, Dh = 1, 2, 8

    def ablate(z, name):
        z = z.clone()
        z[:, :, head] = 0.0
        return z

    hooked = model.run_with_hooks(ids, hooks=[(f"blocks.{layer}.attn.hook_z", ablate)])
    with torch.no_grad():
        model.blocks[layer].attn.out_proj.weight[:, head * Dh : (head + 1) * Dh] = 0
    torch.testing.assert_close(hooked.logits, model(ids).logits, atol=1e-6, rtol=0)


def test_per_head_results_add_up_to_the_attention_output():
    model = gpt()
    ids = torch.randint(0, V, (1, 6))
    name = "blocks.0.attn.hook_result"
    _, cache = model.run_with_cache(ids, names=[name, "blocks.0.hook_attn_out"])
    result = cache[name]  # (B, T, H, D)
    assert result.shape == (1, 6, 4, 32)
    bias = model.blocks[0].attn.out_proj.bias
    torch.testing.assert_close(
        result.sum(2) + bias, cache["blocks.0.hook_attn_out"], atol=1e-6, rtol=0
    )
    _, everything = model.run_with_cache(ids)
    assert name not in everything  # opt-in: H times the output


def test_the_fused_kernel_stays_in_use_unless_scores_or_weights_are_asked_for(monkeypatch):
    model = gpt()
    ids = torch.randint(0, V, (2, 10))
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(
        F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    model.run_with_cache(ids, names="*hook_resid_*")
    model.run_with_cache(ids, names=["blocks.0.attn.hook_q", "hook_logits"])
    model.run_with_cache(ids, names="*.hook_z")
    assert len(calls) == 3 * 2  # every layer of all three runs
    calls.clear()
    _, cache = model.run_with_cache(ids, names="*.hook_pattern")
    assert calls == [] and len(cache) == 2
    assert all(h.fns == [] for h in hook_points(model).values())


def test_hooks_are_removed_even_when_the_run_fails():
    model = gpt()

    def boom(value, name):
        raise RuntimeError("inside a hook")

    with pytest.raises(RuntimeError, match="inside a hook"):
        model.run_with_hooks(torch.randint(0, V, (1, 4)), hooks=[("*.hook_q", boom)])
    assert all(not h.fns for h in hook_points(model).values())
    with model.hooks([("hook_logits", lambda v, n: v * 0)]):
        assert model(torch.randint(0, V, (1, 4))).logits.abs().max() == 0
    assert model(torch.randint(0, V, (1, 4))).logits.abs().max() > 0


def test_a_steering_vector_moves_the_output():
    model = gpt()
    ids = torch.randint(0, V, (1, 5))
    plain = model(ids).logits
    push = torch.randn(32)
    steered = model.run_with_hooks(ids, hooks=[("blocks.0.hook_resid_post", lambda v, n: v + push)])
    assert not torch.allclose(steered.logits, plain)


def test_bad_names_are_one_clear_error():
    model = gpt()
    ids = torch.randint(0, V, (1, 4))
    with pytest.raises(
        ValueError,
        match="no hook point 'blocks.0.attn.hook_patern'; "
        "did you mean 'blocks.0.attn.hook_pattern'",
    ):
        model.run_with_cache(ids, names=["blocks.0.attn.hook_patern"])
    with pytest.raises(ValueError, match="no hook point matches"):
        model.run_with_cache(ids, names="*.hook_nothing")


def test_the_cache_stacks_layers_and_moves():
    model = gpt()
    _, cache = model.run_with_cache(torch.randint(0, V, (2, 6)), names="*hook_resid_post")
    stacked = cache.stack("blocks.*.hook_resid_post")
    assert stacked.shape == (2, 2, 6, 32)
    assert torch.equal(stacked[1], cache["blocks.1.hook_resid_post"])
    half = cache.to(torch.bfloat16)
    assert (
        isinstance(half, ActivationCache)
        and half["blocks.0.hook_resid_post"].dtype == torch.bfloat16
    )
    assert cache.nbytes() == 2 * 2 * 6 * 32 * 4 and "ActivationCache(2 values" in repr(cache)
    with pytest.raises(KeyError, match="did you mean"):
        cache["blocks.0.hook_resid_pots"]


# --- against TransformerLens, on the same GPT-2 weights, nothing folded ----------------------


def test_every_shared_activation_equals_transformer_lens(tmp_path):
    """A random GPT-2 saved by transformers, read by glassformer (GPT.from_pretrained) and by
    TransformerLens (TransformerBridge, no weight processing): the residual stream, q/k/v,
    scores, pattern, z, the MLP's hidden values, each norm's output and the logits equal to
    1e-5."""
    transformers = pytest.importorskip("transformers")
    bridge = pytest.importorskip("transformer_lens.model_bridge")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    theirs = bridge.TransformerBridge.boot_transformers(str(tmp_path), device="cpu")
    ours = GPT.from_pretrained(tmp_path)
    ids = torch.randint(0, 50, (2, 9))
    their_logits, their_cache = theirs.run_with_cache(ids)
    our_out, our_cache = ours.run_with_cache(ids)
    pairs = {"hook_embed": "hook_embed", "hook_pos_embed": "hook_pos_embed"}
    for i in range(2):
        ti, oi = f"blocks.{i}.", f"blocks.{i}."
        for name in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out",
                     "hook_mlp_out"):  # fmt: skip
            pairs[ti + name] = oi + name
        for name in ("hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z"):
            pairs[ti + "attn." + name] = oi + "attn." + name
        pairs[ti + "mlp.hook_pre"] = oi + "mlp.hook_pre"
        pairs[ti + "mlp.hook_post"] = oi + "mlp.hook_post"
        pairs[ti + "ln1.hook_out"] = oi + "ln1.hook_normalized"
        pairs[ti + "ln2.hook_out"] = oi + "ln2.hook_normalized"
    pairs["ln_final.hook_out"] = "ln_final.hook_normalized"
    for their_name, our_name in pairs.items():
        mine = our_cache[our_name]
        torch.testing.assert_close(
            mine.expand_as(their_cache[their_name]), their_cache[their_name],
            atol=1e-5, rtol=0, msg=lambda m, n=our_name: f"{n}: {m}",
        )  # fmt: skip
    torch.testing.assert_close(our_out.logits, their_logits, atol=1e-5, rtol=0)


def test_the_cache_can_be_kept_smaller_as_it_is_taken():
    model = gpt()
    ids = torch.randint(0, V, (2, 6))
    _, full = model.run_with_cache(ids, names="*hook_resid_post")
    _, half = model.run_with_cache(ids, names="*hook_resid_post", dtype=torch.bfloat16)
    assert half.nbytes() * 2 == full.nbytes()
    torch.testing.assert_close(
        half["blocks.1.hook_resid_post"].float(), full["blocks.1.hook_resid_post"],
        atol=0.05, rtol=0.02,
    )  # fmt: skip


# --- the table of names in the docs ---------------------------------------------------------

DOCS = Path(__file__).parents[1] / "docs" / "hooks.md"


def documented_names() -> set[str]:
    """The names in docs/hooks.md's tables, ``{stack}`` spelled out as "", encoder., decoder."""
    names = set()
    for line in DOCS.read_text().splitlines():
        found = re.match(r"\| `([^`]+)` \|", line)
        if found:
            for stack in ("", "encoder.", "decoder.") if "{stack}" in found[1] else ("",):
                names.add(found[1].replace("{stack}", stack))
    return names


def _family_models() -> dict:
    """Small models of the families whose parts add hook points of their own (QK-norm,
    norms after the sub-layers, a mixture of experts with a shared expert)."""
    from glassformer.models.families import GemmaConfig, Olmo2Config, Qwen2MoeConfig

    size = dict(vocab_size=20, max_len=16, d_model=16, num_heads=2, num_layers=2, d_ff=16)
    configs = {
        "gemma 3": GemmaConfig(**size, head_dim=8),
        "olmo 2": Olmo2Config(**size),
        "qwen2-moe": Qwen2MoeConfig(
            **size, num_experts=3, top_k=2, expert_d_ff=8, shared_d_ff=8, dense_layers=[1]
        ),  # fmt: skip
    }
    return {name: (GPT(config), None) for name, config in configs.items()}


FAMILY_MODELS = _family_models()


def test_the_table_of_names_is_every_kinds_names():
    """Every hook point of every model kind, and of the families whose parts add their own,
    is in the docs' table (its block index as {i}, an expert's as {e}), and every name in the
    table is a hook point of some model."""
    from test_hook_replacement import KINDS

    documented = documented_names()
    seen = set()
    for kind, (model, _) in {**KINDS, **FAMILY_MODELS}.items():
        names = {re.sub(r"blocks\.\d+\.", "blocks.{i}.", n) for n in model.hook_names()}
        names = {re.sub(r"experts\.\d+\.", "experts.{e}.", n) for n in names}
        assert names <= documented, (kind, sorted(names - documented))
        seen |= names
    spelled = {n for n in documented if not n.startswith(("encoder.", "decoder."))}
    stacked = {n for n in documented if n.startswith(("encoder.", "decoder."))}
    assert spelled <= seen, sorted(spelled - seen)  # a one-stack name no model has
    assert {n for n in stacked if "cross" in n} <= seen  # the translator's own


# --- gradients and backward hooks -------------------------------------------------------------


def test_gradients_reach_a_frozen_model_under_no_grad():
    """A frozen model (no parameter wants a gradient) called inside no_grad: the gradients at
    the hook points are those of the trainable model."""
    model = gpt().eval()
    ids = torch.randint(0, V, (2, 6))

    def metric(out):
        return out.logits[:, -1, 3].sum() - out.logits[:, -1, 5].sum()

    _, trainable = model.run_with_cache(ids, grads=metric)
    model.requires_grad_(False)
    with torch.no_grad():
        _, frozen = model.run_with_cache(ids, names="blocks.*", grads=metric)
    for name in ("blocks.0.hook_resid_pre_grad", "blocks.1.attn.hook_z_grad"):
        assert trainable[name].abs().sum() > 0
        torch.testing.assert_close(frozen[name], trainable[name], atol=1e-6, rtol=0)


def test_grads_true_differentiates_the_loss_and_asks_for_labels_otherwise():
    model = gpt().eval()
    ids = torch.randint(0, V, (1, 6))
    _, cache = model.run_with_cache(ids, labels=ids, names="*hook_resid_post", grads=True)
    final = cache["blocks.1.hook_resid_post_grad"]
    seen = {}
    with model.hooks([("blocks.1.hook_resid_post", lambda v, n: seen.__setitem__(n, v))]):
        loss = model(ids, labels=ids).loss
    expected = torch.autograd.grad(loss, seen["blocks.1.hook_resid_post"])[0]
    assert final.shape == (1, 6, 32) and final.abs().sum() > 0
    torch.testing.assert_close(final, expected, atol=1e-6, rtol=0)
    assert model.lm_head.weight.grad is None  # the parameters' gradients are left alone
    with pytest.raises(ValueError, match="pass the labels"):
        model.run_with_cache(ids, grads=True)
    with pytest.raises(ValueError, match="one number"):
        model.run_with_cache(ids, grads=lambda out: out.logits)


def test_a_backward_hook_sees_the_gradient_and_can_replace_it():
    """The backward hook at blocks.1.hook_resid_pre sees what run_with_cache reports there;
    replacing it with zeros cuts every path through it: no gradient reaches block 0's weights
    (their only route to the loss passes layer 1's input)."""
    model = gpt().eval()
    ids = torch.randint(0, V, (1, 6))
    _, cache = model.run_with_cache(ids, labels=ids, names="blocks.1.hook_resid_pre", grads=True)
    seen = {}

    def look(grad, name):
        seen[name] = grad.clone()

    out = model.run_with_hooks(ids, labels=ids, backward_hooks=[("blocks.1.hook_resid_pre", look)])
    out.loss.backward()
    torch.testing.assert_close(
        seen["blocks.1.hook_resid_pre"], cache["blocks.1.hook_resid_pre_grad"], atol=1e-6, rtol=0
    )
    first = list(model.blocks[0].parameters())
    assert sum(p.grad.abs().sum() for p in first) > 0
    model.zero_grad(set_to_none=True)
    cut = [("blocks.1.hook_resid_pre", lambda g, n: torch.zeros_like(g))]
    out = model.run_with_hooks(ids, labels=ids, backward_hooks=cut)
    out.loss.backward()
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in first)
