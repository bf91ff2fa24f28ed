"""Looking inside a model through its hook points (``model.run_with_cache``,
``model.run_with_hooks``, gradients with ``run_with_cache(grads=)``): the logit lens, direct
logit attribution, activation patching, head ablation, attribution patching (nodes and
edges), integrated gradients and path patching; attribution graphs with transcoders and
interventions on their features.

    lens = logit_lens(model, ids)                    # each layer's guess at every position
    parts = direct_logit_attribution(model, ids)     # the final logits, split by component
    effect = activation_patching(model, clean, corrupt, logit_difference(a, b))
    estimate = attribution_patching(model, clean, corrupt, logit_difference(a, b))
    edges = edge_attribution_patching(model, clean, corrupt, logit_difference(a, b))
    eap_ig = edge_attribution_patching(model, clean, corrupt, metric, ig_steps=5)
    pairs = ioi_pairs(tokenizer, n=100)               # or greater-than, capitals, a CSV
    scores = circuit_scores(model, pairs, ig_steps=5)  # EAP-IG over the task's pairs
    kept = evaluate_circuit(model, Circuit.top(scores, 700), clean, corrupt, metric)
    curve = faithfulness(CircuitRuns(model, pairs), scores)   # curve.cpr, curve.cmd
    probes = train_probe(model, tokenizer, train, test)  # a probe per residual stream
    vector = steering_vector(model, tokenizer, positive, negative, "blocks.20.hook_resid_post")
    with model.hooks([("blocks.20.hook_resid_post", add(vector, 4.0))]): ...
    tokens = integrated_gradients(model, ids, logit_difference(a, b)).per_token
    path = path_patching(model, clean, corrupt, metric, receivers=[(1, 1)], receiver_input="v")
    graph = attribution_graph(model, transcoders, ids)   # features → features → logits
    after = intervene(model, transcoders, ids, [(layer, position, feature, 0.0)])
"""

from glassformer.inspect.attribution import (
    EdgeAttribution,
    attribution_patching,
    edge_attribution_patching,
)
from glassformer.inspect.circuits import (
    Circuit,
    CircuitRuns,
    Faithfulness,
    circuit_scores,
    evaluate_circuit,
    faithfulness,
    random_scores,
)
from glassformer.inspect.graph import AttributionGraph
from glassformer.inspect.integrated import IntegratedGradients, integrated_gradients
from glassformer.inspect.lens import Attribution, Lens, direct_logit_attribution, logit_lens
from glassformer.inspect.patching import (
    Metric,
    ablate_heads,
    activation_patching,
    logit_difference,
)
from glassformer.inspect.paths import path_patching
from glassformer.inspect.probes import (
    Probe,
    Probes,
    add,
    projections,
    read_vector,
    steering_vector,
    text_features,
    train_probe,
)
from glassformer.inspect.replacement import Intervened, frozen, intervene
from glassformer.inspect.tasks import (
    Pairs,
    capital_pairs,
    greater_than_pairs,
    ioi_pairs,
    pairs_from_csv,
    task_pairs,
)
from glassformer.inspect.tracing import attribution_graph

# the cache run_with_cache returns lives with the hook points (models return it)
from glassformer.modules.hooking import ActivationCache

__all__ = [
    "ActivationCache",
    "Attribution",
    "AttributionGraph",
    "Circuit",
    "CircuitRuns",
    "EdgeAttribution",
    "Faithfulness",
    "IntegratedGradients",
    "Intervened",
    "Lens",
    "Metric",
    "Pairs",
    "Probe",
    "Probes",
    "ablate_heads",
    "add",
    "activation_patching",
    "attribution_graph",
    "attribution_patching",
    "capital_pairs",
    "circuit_scores",
    "direct_logit_attribution",
    "edge_attribution_patching",
    "evaluate_circuit",
    "faithfulness",
    "frozen",
    "greater_than_pairs",
    "integrated_gradients",
    "intervene",
    "ioi_pairs",
    "logit_difference",
    "logit_lens",
    "pairs_from_csv",
    "path_patching",
    "random_scores",
    "projections",
    "read_vector",
    "steering_vector",
    "task_pairs",
    "text_features",
    "train_probe",
]
