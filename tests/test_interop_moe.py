"""Hugging Face mixtures of experts read into GPT: Mixtral, OLMoE and Qwen2-MoE equal to
transformers in every activation both expose, the same experts chosen with the same
weights, 20 greedy tokens; each expert's output a hook point that patches as a
recomputation says.

Random small models: 4 to 8 experts, 1 to 3 chosen, renormalised or not, a shared expert,
a dense layer among the routed ones (Qwen2-MoE's mlp_only_layers).
"""

import copy

import pytest
import torch
from hf_families import (
    IDS,
    LLAMA_SHAPED,
    SMALL_DECODER,
    check_generation,
    check_precisions_and_tools,
    check_refused,
    compare_activations,
    randomize,
    save_and_open,
)

from glassformer.modules.experts import MixtureOfExperts

transformers = pytest.importorskip("transformers")

ATTENTION = {k: v for k, v in LLAMA_SHAPED.items() if not k.endswith(".mlp")}
CASES = {  # name: (family, transformers' class prefix, the config's changes)
    "mixtral-8-top2-gqa": ("Mixtral", "Mixtral", dict(num_local_experts=8,
                           num_experts_per_tok=2, num_key_value_heads=2, intermediate_size=24)),
    "mixtral-4-top1-window": ("Mixtral", "Mixtral", dict(num_local_experts=4,
                              num_experts_per_tok=1, sliding_window=4, num_key_value_heads=4)),
    "olmoe-8-top3": ("OLMoE", "Olmoe", dict(num_experts=8, num_experts_per_tok=3,
                     num_key_value_heads=2, intermediate_size=24)),
    "olmoe-6-top2-normalized": ("OLMoE", "Olmoe", dict(num_experts=6, num_experts_per_tok=2,
                                norm_topk_prob=True, tie_word_embeddings=True)),
    "qwen2moe-shared-dense-layer": ("Qwen2-MoE", "Qwen2Moe", dict(
        num_experts=6, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=40, mlp_only_layers=[1], num_key_value_heads=2)),
    "qwen2moe-normalized-sparse-step": ("Qwen2-MoE", "Qwen2Moe", dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=24, norm_topk_prob=True, decoder_sparse_step=1,
        num_key_value_heads=4)),
}  # fmt: skip


def _moe(tmp_path, name):
    _, prefix, changes = CASES[name]
    size = {**SMALL_DECODER, "num_hidden_layers": 2}
    config = getattr(transformers, f"{prefix}Config")(**{**size, **changes}, pad_token_id=None)
    hf = getattr(transformers, f"{prefix}ForCausalLM")(config).eval()
    randomize(hf, norms=(1.0, 0.2))
    with torch.no_grad():  # a router sharp enough that no two experts tie at the k-th place
        for layer_name, p in hf.named_parameters():
            if layer_name.endswith("gate.weight") and p.size(0) > 1:
                p.mul_(8.0)
    return hf, save_and_open(hf, tmp_path / name), tmp_path / name


def _modules(ours):
    modules = dict(ATTENTION)  # (transformers 5 names Mixtral's block_sparse_moe "mlp")
    modules["model.layers.{i}.mlp"] = "blocks.{i}.hook_mlp_out"
    # (the router's logits: test_the_same_experts_are_chosen_with_the_same_weights)
    if ours.config.family == "olmoe":
        modules["model.layers.{i}.self_attn.q_norm"] = "blocks.{i}.attn.q_norm.hook_normalized"
        modules["model.layers.{i}.self_attn.k_norm"] = "blocks.{i}.attn.k_norm.hook_normalized"
    return modules


def _routing(hf, ours, ids):
    """transformers' router outputs (logits, weights as (B·T, E) with zeros, indices) and
    glassformer's hook values, for every routed layer."""
    seen = {}
    handles = []
    for i, block in enumerate(ours.blocks):
        if not isinstance(block.mlp, MixtureOfExperts):
            continue
        gate = hf.get_submodule(f"model.layers.{i}.mlp.gate")
        handles.append(gate.register_forward_hook(
            lambda m, a, out, i=i: seen.__setitem__(i, out)))  # fmt: skip
    with torch.no_grad():
        hf(ids)
    for h in handles:
        h.remove()
    _, cache = ours.run_with_cache(ids)
    return seen, cache


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_activation_equals_transformers(tmp_path, name, support):
    hf, ours, _ = _moe(tmp_path, name)
    modules = _modules(ours)
    assert compare_activations(hf, ours, IDS, modules) == 2 + 2 * (2 + len(modules))
    support(CASES[name][0], "load", "logits", "every activation")


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_same_experts_are_chosen_with_the_same_weights(tmp_path, name):
    """Router logits within 1e-4, the chosen experts identical and their weights within
    1e-5 of transformers', at inputs where no two experts tie at the k-th place."""
    hf, ours, _ = _moe(tmp_path, name)
    seen, cache = _routing(hf, ours, IDS)
    assert seen, "no routed layer"
    for i, (logits, scores, indices) in seen.items():
        mine_logits = cache[f"blocks.{i}.mlp.hook_router_logits"].reshape(logits.shape)
        torch.testing.assert_close(mine_logits, logits, atol=1e-4, rtol=0)
        ranked = logits.float().sort(dim=-1, descending=True).values
        k = indices.size(-1)
        if k < ranked.size(-1):  # the k-th and the next apart: the choice is not a tie
            assert float((ranked[:, k - 1] - ranked[:, k]).min()) > 1e-3
        weights = cache[f"blocks.{i}.mlp.hook_router_weights"].reshape(logits.shape)
        chosen = weights.topk(k, dim=-1).indices.sort(dim=-1).values
        assert torch.equal(chosen, indices.sort(dim=-1).values), i
        expected = torch.zeros_like(weights).scatter(-1, indices, scores.float())
        torch.testing.assert_close(weights, expected, atol=1e-5, rtol=0)
        assert int((weights > 0).sum(-1).max()) == k


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_tokens_equal_and_cached_equals_uncached(tmp_path, name, support):
    hf, ours, _ = _moe(tmp_path, name)
    check_generation(hf, ours, IDS[:, :4])
    support(CASES[name][0], "generate with cache")


@pytest.mark.parametrize(
    "name", ["mixtral-8-top2-gqa", "olmoe-8-top3", "qwen2moe-shared-dense-layer"]
)
def test_int8_int4_and_the_glass_box_tools_run_on_it(tmp_path, name, support):
    _, ours, _ = _moe(tmp_path, name)
    check_precisions_and_tools(ours, (IDS,))
    support(CASES[name][0], "int8/int4", "lens/patching/viewer")


def test_each_expert_runs_only_where_chosen_and_the_sum_is_the_output(tmp_path):
    """experts.{e}.hook_out is 0 exactly at the tokens that did not choose e; weighted by
    the router and summed (plus the gated shared expert) it is the MLP's output; and an
    expert is called on its chosen tokens only."""
    _, ours, _ = _moe(tmp_path, "qwen2moe-shared-dense-layer")
    mlp = ours.blocks[0].mlp
    calls = []
    handle = mlp.experts[0].register_forward_hook(lambda m, a, out: calls.append(a[0].shape[0]))
    _, cache = ours.run_with_cache(IDS)
    handle.remove()
    weights = cache["blocks.0.mlp.hook_router_weights"]
    total = torch.zeros_like(cache["blocks.0.hook_mlp_out"])
    for e in range(mlp.num_experts):
        out = cache[f"blocks.0.mlp.experts.{e}.hook_out"]
        ran = out.abs().sum(-1) > 0
        assert torch.equal(ran, weights[..., e] > 0), e
        total += weights[..., e, None] * out
    total += cache["blocks.0.mlp.hook_shared_weight"] * cache["blocks.0.mlp.shared_expert.hook_out"]
    torch.testing.assert_close(total, cache["blocks.0.hook_mlp_out"], atol=1e-6, rtol=0)
    assert calls == [int((weights[..., 0] > 0).sum())] and calls[0] < IDS.numel()
    assert "blocks.1.mlp.hook_router_logits" not in cache  # layer 1 is dense


def test_patching_one_experts_output_changes_the_logits_as_recomputed(tmp_path):
    """Adding δ to expert e's output at one token where it was chosen moves the logits
    exactly as adding w_e · δ to transformers' MoE output there does."""
    hf, ours, _ = _moe(tmp_path, "mixtral-8-top2-gqa")
    _, cache = ours.run_with_cache(IDS)
    weights = cache["blocks.0.mlp.hook_router_weights"]
    b, t, e = (int(x) for x in (weights[..., :] > 0).nonzero()[5])
    delta = torch.randn(32, generator=torch.Generator().manual_seed(1))

    def patch(value, name):
        value = value.clone()
        value[b, t] += delta
        return value

    with torch.no_grad():
        patched = ours.run_with_hooks(IDS, hooks=[(f"blocks.0.mlp.experts.{e}.hook_out", patch)])

        def recompute(module, args, out):
            out = out.clone()
            out[b, t] += weights[b, t, e] * delta
            return out

        handle = hf.model.layers[0].mlp.register_forward_hook(recompute)
        expected = hf(IDS).logits
        handle.remove()
        plain = hf(IDS).logits
    torch.testing.assert_close(patched.logits, expected, atol=1e-4, rtol=0)
    assert (expected - plain).abs().max() > 1e-3


def test_renormalising_the_chosen_weights_is_the_familys_choice(tmp_path):
    """Mixtral renormalises the k chosen weights to sum to 1, OLMoE-1B-7B does not: the
    other choice moves the logits away from transformers'."""
    for name in ("mixtral-8-top2-gqa", "olmoe-8-top3"):
        hf, ours, _ = _moe(tmp_path, name)
        flipped = copy.deepcopy(ours)
        for block in flipped.blocks:
            block.mlp.normalize = not block.mlp.normalize
        with torch.no_grad():
            expected = hf(IDS).logits
            torch.testing.assert_close(ours(IDS).logits, expected, atol=1e-4, rtol=0)
            assert (flipped(IDS).logits - expected).abs().max() > 1e-3, name


def test_replacing_the_router_weights_reroutes(tmp_path):
    """A token sent to an expert it did not choose (by replacing hook_router_weights) runs
    that expert there: its output hook is no longer 0 at that token."""
    _, ours, _ = _moe(tmp_path, "mixtral-4-top1-window")
    _, cache = ours.run_with_cache(IDS)
    weights = cache["blocks.0.mlp.hook_router_weights"]
    e = int((weights[0, 0] == 0).nonzero()[0])

    def reroute(value, name):
        value = value.clone()
        value[0, 0] = 0.0
        value[0, 0, e] = 1.0
        return value

    with ours.hooks([("blocks.0.mlp.hook_router_weights", reroute)]):
        _, rerouted = ours.run_with_cache(IDS)
    assert rerouted[f"blocks.0.mlp.experts.{e}.hook_out"][0, 0].abs().sum() > 0
    assert cache[f"blocks.0.mlp.experts.{e}.hook_out"][0, 0].abs().sum() == 0


@pytest.mark.parametrize(
    "name, changes, message",
    [
        ("mixtral-8-top2-gqa", dict(num_experts_per_tok=9), "top_k must be an integer in 1..8"),
        ("mixtral-8-top2-gqa", dict(num_local_experts=0), "num_local_experts is 0"),
        ("mixtral-8-top2-gqa", dict(num_local_experts=10**9), "num_local_experts is 1000000000"),
        ("qwen2moe-shared-dense-layer", dict(moe_intermediate_size=0), "moe_intermediate_size"),
        ("qwen2moe-shared-dense-layer", dict(shared_expert_intermediate_size=-1), "shared_exp"),
        ("olmoe-8-top3", dict(clip_qkv=8.0), "OLMoE clip_qkv=8.0"),
        ("qwen2moe-shared-dense-layer", dict(qkv_bias=False), "Qwen2-MoE qkv_bias=False"),
        ("qwen2moe-shared-dense-layer", dict(mlp_only_layers="1"), "mlp_only_layers"),
        ("qwen2moe-shared-dense-layer", dict(decoder_sparse_step=0), "decoder_sparse_step"),
        ("mixtral-8-top2-gqa", dict(num_experts_per_tok="2"), "num_experts_per_tok is '2'"),
    ],
)
def test_what_glassformer_cannot_express_is_one_error(tmp_path, name, changes, message):
    _, _, path = _moe(tmp_path, name)
    check_refused(path, message, **changes)


def test_quantising_keeps_the_router_exact_and_compiling_is_refused(tmp_path):
    """for_inference("int8"/"int4") quantises the experts but not the router or the shared
    expert's gate (rounding their scores would flip which experts a token goes to), and a
    compiled generation, whose step has fixed shapes, refuses a mixture of experts in one
    line."""
    _, ours, _ = _moe(tmp_path, "qwen2moe-shared-dense-layer")
    for kind in ("int8", "int4"):
        quantised = copy.deepcopy(ours).for_inference(kind)
        mlp = quantised.blocks[0].mlp
        assert type(mlp.router) is torch.nn.Linear and type(mlp.shared_gate) is torch.nn.Linear
        assert type(mlp.experts[0].gate_proj) is not torch.nn.Linear, kind
    with pytest.raises(ValueError, match="compile=True does not take a mixture of experts"):
        ours.generate(IDS[:1, :4], 3, compile=True)


def test_a_qwen2_moe_config_without_the_shared_width_takes_transformers_default(tmp_path):
    """transformers' Qwen2-MoE builds a shared expert of 5632 where the config names none:
    so does glassformer (a config without it is not a model without a shared expert)."""
    from glassformer.models.families import Qwen2MoeConfig

    hf = _moe(tmp_path, "qwen2moe-shared-dense-layer")[0].config.to_dict()
    del hf["shared_expert_intermediate_size"]
    assert Qwen2MoeConfig.from_hf(hf).shared_d_ff == 5632
