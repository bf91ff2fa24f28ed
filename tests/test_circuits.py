"""Circuits (glassformer.inspect.circuits) and EAP-IG (edge_attribution_patching's ig_steps):
the scores equal a forward pass written by hand in float64 (tests/circuit_reference.py),
step for step and in the limit of many steps; one step is EAP bit for bit; the planted
circuit of the path-patching test ranks first; evaluate_circuit gives the clean metric for
the full circuit and the corrupted one for the empty circuit exactly, and equals patching
by hand edge by edge; the faithfulness curve, CPR and CMD as MIB integrates them."""

from __future__ import annotations

import pytest
import torch
from circuit_reference import HandGPT
from test_paths import inputs as planted_inputs
from test_paths import planted
from torch import Tensor

from glassformer import GPT, GPTConfig
from glassformer.inspect import edge_attribution_patching, logit_difference
from glassformer.inspect.circuits import (
    Circuit,
    CircuitRuns,
    Faithfulness,
    circuit_scores,
    evaluate_circuit,
    faithfulness,
    random_scores,
)
from glassformer.inspect.tasks import Pairs
from glassformer.models.families import GPTNeoXConfig

SIZE = dict(vocab_size=20, max_len=16, d_model=32, num_heads=4, num_layers=2, d_ff=64,
            dropout=0.0)  # fmt: skip
SHAPES = {
    "gpt2": {},
    "parallel": {"family": GPTNeoXConfig, "parallel": True},
    "llama": {"num_kv_heads": 2, "norm": "rms", "activation": "swiglu", "positional": "rope"},
}


def gpt(family: type = GPTConfig, dtype=torch.float32, **changes) -> GPT:
    torch.manual_seed(0)
    return GPT(family(**{**SIZE, **changes})).eval().to(dtype)


def pair(length: int = 7, where: int = 2, seed: int = 3):
    """Ids from 1 (0 is the pad id, which the model masks)."""
    torch.manual_seed(seed)
    clean = torch.randint(1, 20, (1, length))
    corrupt = clean.clone()
    corrupt[0, where] = clean[0, where] % 19 + 1
    return clean, corrupt


def by_hand_differences(ours, reference) -> tuple[float, float]:
    """(largest difference over the real edges, largest score) of ours and a hand dict."""
    worst = biggest = 0.0
    for w, writer in enumerate(ours.writers):
        for r, reader in enumerate(ours.readers):
            if ours.edges[w, r]:
                theirs = reference[writer, reader]
                worst = max(worst, float((ours.scores[w, r] - theirs).abs().max()))
                biggest = max(biggest, float(theirs.abs().max()))
    return worst, biggest


@pytest.mark.parametrize(("steps", "over"), [(1, "inputs"), (5, "inputs"), (4, "activations")])
def test_eap_ig_equals_the_reference_written_by_hand(steps, over):
    """Every edge at every position, in float64: the readers' gradients through the hook
    points and batched vector-Jacobian products against those of a forward pass in which
    each reader reads its own copy of the stream, on the same left Riemann points."""
    model = gpt(dtype=torch.float64)
    clean, corrupt = pair()
    metric = logit_difference(3, 4)
    ours = edge_attribution_patching(model, clean, corrupt, metric, ig_steps=steps, ig_over=over)
    reference = HandGPT(model).edge_scores(clean, corrupt, metric.tensor, steps, over)
    worst, biggest = by_hand_differences(ours, reference)
    assert biggest > 1e-3 and worst < 1e-12 * biggest


def test_eap_ig_converges_to_the_integral_of_its_path():
    """The reference integrates the path with 400 steps; 5 steps are off by a few percent of
    the largest edge, 50 steps by ten times less: the integral the steps approximate."""
    model = gpt(dtype=torch.float64)
    clean, corrupt = pair()
    metric = logit_difference(3, 4)
    limit = HandGPT(model).edge_scores(clean, corrupt, metric.tensor, 400)
    errors = {}
    for steps in (5, 50):
        ours = edge_attribution_patching(model, clean, corrupt, metric, ig_steps=steps)
        errors[steps], biggest = by_hand_differences(ours, limit)
    assert errors[50] < 0.02 * biggest and errors[50] < errors[5] / 5


@pytest.mark.parametrize("over", ["inputs", "activations"])
def test_one_step_is_eap_bit_for_bit(over):
    model = gpt()
    clean, corrupt = pair()
    metric = logit_difference(3, 4)
    eap = edge_attribution_patching(model, clean, corrupt, metric)
    one = edge_attribution_patching(model, clean, corrupt, metric, ig_steps=1, ig_over=over)
    assert torch.equal(eap.scores, one.scores) and eap.scores.abs().max() > 1e-4


def test_the_planted_circuit_ranks_first():
    """The path-patching test's model: head (0, 0) sends to head (1, 1)'s values and no
    other head does; heads (0, 1) and (0, 2) send to head (1, 0)'s. Into (1, 1).v the edge
    from (0, 0) scores ten times any other; out of (0, 0) its edge to (1, 1).v does; into
    (1, 0).v the two planted senders score ten times (0, 0)."""
    model = planted()
    clean, corrupt = planted_inputs()
    scores = edge_attribution_patching(model, clean, corrupt, logit_difference(2, 5), ig_steps=5)
    total = scores.scores.sum(2).abs()

    def ranked(column: Tensor, names: list[str]) -> list[tuple[str, float]]:
        order = column.argsort(descending=True)
        return [(names[i], float(column[i])) for i in order.tolist()]

    into = ranked(total[:, scores.readers.index("L1.H1.v")], scores.writers)
    assert into[0][0] == "L0.H0" and into[0][1] > 5e-2 and into[0][1] > 5 * into[1][1]
    out = ranked(total[scores.writers.index("L0.H0")], scores.readers)
    assert out[0][0] == "L1.H1.v" and out[0][1] > 10 * out[1][1]
    into = ranked(total[:, scores.readers.index("L1.H0.v")], scores.writers)
    assert {into[0][0], into[1][0]} == {"L0.H1", "L0.H2"}
    assert into[1][1] > 10 * dict(into)["L0.H0"]


@pytest.mark.parametrize("shape", SHAPES)
def test_full_and_empty_circuits_give_the_clean_and_corrupted_metrics_exactly(shape):
    model = gpt(**SHAPES[shape])
    clean, corrupt = pair()
    metric = logit_difference(3, 4)
    scores = edge_attribution_patching(model, clean, corrupt, metric)
    with torch.no_grad():
        ends = float(metric(model(clean).logits)), float(metric(model(corrupt).logits))
    assert ends[0] != ends[1]
    assert evaluate_circuit(model, Circuit.full(scores), clean, corrupt, metric) == ends[0]
    assert evaluate_circuit(model, Circuit.empty(scores), clean, corrupt, metric) == ends[1]


@pytest.mark.parametrize("n", [7, 30, 80])
def test_evaluate_circuit_equals_patching_each_edge_by_hand(n):
    """Circuits of the top n edges, run on a float64 GPT-2: every reader's input built by
    hand as the sum of its writers' outputs, the corrupted run's for each edge outside."""
    model = gpt(dtype=torch.float64)
    clean, corrupt = pair()
    metric = logit_difference(3, 4)
    scores = edge_attribution_patching(model, clean, corrupt, metric)
    circuit = Circuit.top(scores, n)
    hand = HandGPT(model)
    outside = {(scores.writers[w], scores.readers[r])
               for w, r in (scores.edges & ~circuit.edges).nonzero().tolist()}  # fmt: skip
    logits, _ = hand.run(clean, outside=outside, other=hand.run(corrupt)[1])
    theirs = float(metric(logits[None]))
    ours = evaluate_circuit(model, circuit, clean, corrupt, metric)
    assert ours == pytest.approx(theirs, abs=1e-12)
    ends = [float(metric(hand.run(x)[0][None])) for x in (clean, corrupt)]
    assert min(abs(theirs - end) for end in ends) > 1e-4 * abs(ends[0] - ends[1])  # in between


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("writer", ["L0.H1", "L0.mlp", "L1.H3"])
def test_a_writer_cut_from_its_readers_is_its_output_patched(shape, writer):
    """Every edge but a writer's: each of its readers reads its own stream (the mixed case:
    through the norm and that head's rows of the projection, under rotary, grouped-query and
    parallel blocks), and together they see the corrupted write where that writer's output
    patched to the corrupted run's would put it."""
    model = gpt(**SHAPES[shape])
    clean, corrupt = pair()
    metric = logit_difference(3, 4)
    scores = edge_attribution_patching(model, clean, corrupt, metric)
    edges = scores.edges.clone()
    edges[scores.writers.index(writer)] = False
    circuit = Circuit(scores.writers, scores.readers, edges, scores.edges)
    layer, part = writer.split(".")
    name = f"blocks.{layer[1:]}." + ("hook_mlp_out" if part == "mlp" else "attn.hook_z")
    _, cache = model.run_with_cache(corrupt, names=[name])

    def patch(value, _):
        value = value.clone()
        if part == "mlp":
            return cache[name]
        value[:, :, int(part[1:])] = cache[name][:, :, int(part[1:])]
        return value

    with torch.no_grad():
        patched = float(metric(model.run_with_hooks(clean, hooks=[(name, patch)]).logits))
        clean_value = float(metric(model(clean).logits))
    ours = evaluate_circuit(model, circuit, clean, corrupt, metric)
    assert abs(patched - clean_value) > 1e-4  # the writer matters
    assert ours == pytest.approx(patched, abs=2e-6)


def test_a_batch_scores_the_sum_of_its_pairs():
    model = gpt()
    pairs = [pair(seed=s) for s in (3, 4, 5)]
    clean = torch.cat([c for c, _ in pairs])
    corrupt = torch.cat([c for _, c in pairs])
    metric = logit_difference(3, 4)

    def summed(logits):
        return (logits[:, -1, 3] - logits[:, -1, 4]).sum()

    batch = edge_attribution_patching(model, clean, corrupt, summed, ig_steps=3)
    one = [edge_attribution_patching(model, c, k, metric, ig_steps=3).scores for c, k in pairs]
    torch.testing.assert_close(batch.scores, sum(one), atol=1e-6, rtol=1e-5)


def test_circuits_are_chosen_from_scores():
    model = gpt()
    clean, corrupt = pair()
    scores = edge_attribution_patching(model, clean, corrupt, logit_difference(3, 4))
    total = scores.scores.sum(2)
    top = Circuit.top(scores, 10)
    assert len(top) == 10 and bool((top.edges <= scores.edges).all())
    assert total[top.edges].abs().min() >= total[scores.edges & ~top.edges].abs().max()
    signed = Circuit.top(scores, 10, absolute=False)
    assert total[signed.edges].min() >= total[scores.edges & ~signed.edges].max()
    greedy = Circuit.greedy(scores, 12)
    assert len(greedy) == 12 and len(greedy.pruned()) <= 12
    assert "logits" in greedy.nodes  # every edge grown from the logits
    reachable = {"logits"}
    for w, r in sorted(greedy.edges.nonzero().tolist(), key=lambda p: -p[1]):
        assert greedy.readers[r].rsplit(".", 1)[0] in reachable or greedy.readers[r] in reachable
        reachable.add(greedy.writers[w])
    with pytest.raises(ValueError, match="from 0 to"):
        Circuit.top(scores, 10**6)


def test_faithfulness_integrates_as_mib_does():
    """CPR and CMD are MIB's trapezoids over the fraction of edges; the curve ends at 1 (the
    full circuit); random circuits keep less of the metric than the scores' own."""
    curve = Faithfulness((0.1, 0.5, 1.0), (1, 5, 10), (0.2, 0.6, 1.0), (0.5, 1.2, 1.0), 2.0, 1.0)
    assert curve.cpr == pytest.approx(0.4 * 0.4 + 0.5 * 0.8)
    assert curve.cmd == pytest.approx(0.4 * (0.5 + 0.2) / 2 + 0.5 * (0.2 + 0.0) / 2)
    model = gpt()
    clean, corrupt = pair()
    pairs = Pairs("test", clean.tolist(), corrupt.tolist(), [[3]], [[4]], [("", "")])
    runs = CircuitRuns(model, pairs)
    scores = circuit_scores(model, pairs, ig_steps=3)
    found = faithfulness(runs, scores, (0.05, 0.2, 1.0))
    assert found.signed[-1] == found.absolute[-1] == 1.0
    baseline = faithfulness(runs, random_scores(scores), (0.05, 0.2, 1.0))
    assert found.cmd < baseline.cmd


def test_bad_requests_are_one_line():
    model = gpt()
    clean, corrupt = pair()
    metric = logit_difference(3, 4)
    scores = edge_attribution_patching(model, clean, corrupt, metric)
    with pytest.raises(ValueError, match="ig_steps must be a positive integer"):
        edge_attribution_patching(model, clean, corrupt, metric, ig_steps=0)
    with pytest.raises(ValueError, match="ig_over must be one of"):
        edge_attribution_patching(model, clean, corrupt, metric, ig_steps=2, ig_over="z")
    with pytest.raises(ValueError, match="same shapes"):
        evaluate_circuit(model, Circuit.full(scores), clean, corrupt[:, :5], metric)
    other = gpt(num_layers=3)
    with pytest.raises(ValueError, match="another model's"):
        evaluate_circuit(other, Circuit.full(scores), clean, corrupt, metric)
    with pytest.raises(ValueError, match="post-norm"):
        edge_attribution_patching(gpt(norm_first=False), clean, corrupt, metric)


def test_clipped_projections_take_the_projections_own_gradient():
    """OLMo's clip_qkv: the gradient through the clamp needs its input, so those readers'
    gradients come from q, k and v by vector-Jacobian products; with a clip no value reaches,
    the same scores as the unclipped model's shortcut through the projection's rows."""
    model = gpt(**SHAPES["llama"])
    clean, corrupt = pair()
    metric = logit_difference(3, 4)
    plain = edge_attribution_patching(model, clean, corrupt, metric, ig_steps=2)
    for block in model.blocks:
        block.attn.clip = 1e6
    clipped = edge_attribution_patching(model, clean, corrupt, metric, ig_steps=2)
    torch.testing.assert_close(clipped.scores, plain.scores, atol=1e-6, rtol=1e-5)
