"""Attribution patching (glassformer.inspect.attribution): equal to TransformerLens's own
implementation on the same random GPT-2, node and edge level; exact where the model is linear
in the patched activation; edges summing to their writers' nodes; every kind's nodes."""

from __future__ import annotations

import pytest
import torch

from glassformer import GPT, GPTConfig
from glassformer.inspect import (
    activation_patching,
    attribution_patching,
    edge_attribution_patching,
    logit_difference,
)
from glassformer.models.families import GPTNeoXConfig, OPTConfig

SIZE = dict(vocab_size=20, max_len=16, d_model=32, num_heads=4, num_layers=2, d_ff=64,
            dropout=0.0)  # fmt: skip


def gpt(family: type = GPTConfig, **changes) -> GPT:
    """A small GPT of the textbook's config, or of a ``family``'s."""
    torch.manual_seed(0)
    return GPT(family(**{**SIZE, **changes})).eval()


def pair(vocab: int = 20, length: int = 7, where: int = 2):
    torch.manual_seed(3)
    clean = torch.randint(0, vocab, (1, length))
    corrupt = clean.clone()
    corrupt[0, where] = (clean[0, where] + 5) % vocab
    return clean, corrupt


def test_nodes_and_edges_equal_transformer_lens_on_the_same_gpt2(tmp_path):
    """A random GPT-2 saved by transformers, read by glassformer and by TransformerLens's
    TransformerBridge: ``attribution_patch`` (its node and edge sweeps) and ours agree to
    1e-5 for every embedding position, head, MLP output and each of its 880 edges."""
    transformers = pytest.importorskip("transformers")
    bridge = pytest.importorskip("transformer_lens.model_bridge")
    tl = pytest.importorskip("transformer_lens.tools.analysis.attribution_patching")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=32, n_layer=2,
        n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    theirs = bridge.TransformerBridge.boot_transformers(str(tmp_path), device="cpu").eval()
    ours = GPT.from_pretrained(tmp_path).eval()
    clean, corrupt = pair(50, 8, 3)
    metric = logit_difference(7, 9)
    nodes = tl.attribution_patch(theirs, clean, corrupt, metric.tensor).node_scores
    with torch.no_grad():
        base = float(metric(ours(corrupt).logits))
    heads = attribution_patching(ours, clean, corrupt, metric, what="z") - base
    mlps = attribution_patching(ours, clean, corrupt, metric, what="mlp_out") - base
    embed = attribution_patching(ours, clean, corrupt, metric, what="resid_pre")[0] - base
    their_heads = torch.zeros(2, 4)
    for node, score in nodes.items():
        if node.kind == "attn_head_out":
            their_heads[node.layer, node.head] += score  # theirs per position; ours summed
        elif node.kind == "mlp_out":
            assert mlps[node.layer, node.position] == pytest.approx(score, abs=1e-5)
        else:
            assert node.kind == "embed" and embed[node.position] == pytest.approx(score, abs=1e-5)
    assert their_heads.abs().max() > 1e-3  # a comparison of numbers, not of zeros
    torch.testing.assert_close(heads, their_heads, atol=1e-5, rtol=0)

    their_edges = tl.attribution_patch(
        theirs, clean, corrupt, metric.tensor, tl.EdgeAttributionConfig(granularity="edge")
    ).edge_scores
    ours_edges = edge_attribution_patching(ours, clean, corrupt, metric)
    names = {"embed": lambda n: "embed", "attn_head_out": lambda n: f"L{n.layer}.H{n.head}",
             "mlp_out": lambda n: f"L{n.layer}.mlp", "mlp_in": lambda n: f"L{n.layer}.mlp",
             "logits": lambda n: "logits"}  # fmt: skip
    for reader in ("q", "k", "v"):
        names[f"{reader}_input"] = lambda n, r=reader: f"L{n.layer}.H{n.head}.{r}"
    assert len(their_edges) == int(ours_edges.edges.sum()) * 8 == 880
    for (writer, reader), score in their_edges.items():
        w = ours_edges.writers.index(names[writer.kind](writer))
        r = ours_edges.readers.index(names[reader.kind](reader))
        assert ours_edges.edges[w, r]
        assert float(ours_edges.scores[w, r, writer.position]) == pytest.approx(score, abs=1e-5)


def test_exact_where_the_model_is_linear_in_the_patched_activation():
    """The MLP's output enters the stream, and with no norm after it (OPT-350m's shape: no
    final norm, the last block's) the logits are linear in it: the estimate for the last
    layer's MLP output is the activation patch itself, at every position."""
    model = gpt(OPTConfig, final_norm=False)
    with torch.no_grad():  # MLPs that matter (a random init's barely move the logits)
        for block in model.blocks:
            block.mlp.linear2.weight.mul_(30)
    clean, corrupt = pair(where=6)  # the last token: the metric's own position
    metric = logit_difference(3, 4)
    estimate = attribution_patching(model, clean, corrupt, metric, what="mlp_out")
    patched = activation_patching(model, clean, corrupt, metric, what="mlp_out")
    torch.testing.assert_close(estimate[-1], patched[-1], atol=1e-5, rtol=0)
    assert (patched[-1, -1] - patched[-1, 0]).abs() > 1e-3  # 100 times the tolerance


def test_close_to_activation_patching_on_heads_and_outputs():
    model = gpt()
    clean, corrupt = pair()
    metric = logit_difference(3, 4)
    for what in ("z", "attn_out", "mlp_out"):
        a = attribution_patching(model, clean, corrupt, metric, what=what).flatten()
        b = activation_patching(model, clean, corrupt, metric, what=what).flatten()
        assert torch.corrcoef(torch.stack([a, b]))[0, 1] > 0.99, what


SHAPES = [{}, {"family": GPTNeoXConfig, "parallel": True},
          {"num_kv_heads": 2, "norm": "rms", "activation": "swiglu"}]  # fmt: skip


@pytest.mark.parametrize("changes", SHAPES)
def test_edges_add_up_to_their_writers_nodes(changes):
    """A writer's edges, summed over readers and positions, are its node attribution (the
    gradient at its output is the sum of what each reader takes from it): per head (hook_z)
    and per MLP; sequential, parallel and grouped-query blocks."""
    model = gpt(**changes)
    clean, corrupt = pair()
    metric = logit_difference(3, 4)
    edges = edge_attribution_patching(model, clean, corrupt, metric)
    base = edges.metric
    heads = attribution_patching(model, clean, corrupt, metric, what="z") - base
    mlps = (attribution_patching(model, clean, corrupt, metric, what="mlp_out") - base).sum(1)
    nodes = edges.node_scores
    for layer in range(2):
        for head in range(4):
            assert nodes[edges.writers.index(f"L{layer}.H{head}")] == pytest.approx(
                float(heads[layer, head]), abs=1e-6
            )
        assert nodes[edges.writers.index(f"L{layer}.mlp")] == pytest.approx(
            float(mlps[layer]), abs=1e-6
        )
    readers = {r.rsplit(".", 1)[-1] for r in edges.readers}
    assert {"q", "k", "v", "mlp", "logits"} <= readers
    assert len([r for r in edges.readers if r.startswith("L0.") and r.endswith(".k")]) == (
        changes.get("num_kv_heads", 4)
    )
    if changes.get("parallel"):  # a parallel block's MLP does not read its own attention
        assert not edges.edges[edges.writers.index("L0.H0"), edges.readers.index("L0.mlp")]
    else:
        assert edges.edges[edges.writers.index("L0.H0"), edges.readers.index("L0.mlp")]
    top = edges.top(3)
    assert len(top) == 3 and abs(top[0][2]) >= abs(top[1][2])


def test_bad_requests_are_one_line():
    model = gpt()
    clean, corrupt = pair()
    metric = logit_difference(3, 4)
    with pytest.raises(ValueError, match="what must be one of"):
        attribution_patching(model, clean, corrupt, metric, what="q")
    with pytest.raises(ValueError, match="same shapes"):
        attribution_patching(model, clean, corrupt[:, :4], metric)
    with pytest.raises(TypeError, match="must return a tensor"):
        attribution_patching(model, clean, corrupt, lambda logits: 1.0)
    with pytest.raises(ValueError, match="post-norm"):
        edge_attribution_patching(gpt(norm_first=False), clean, corrupt, metric)
