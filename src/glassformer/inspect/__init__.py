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
from glassformer.inspect.replacement import Intervened, frozen, intervene
from glassformer.inspect.tracing import attribution_graph

# the cache run_with_cache returns lives with the hook points (models return it)
from glassformer.modules.hooking import ActivationCache

__all__ = [
    "ActivationCache",
    "Attribution",
    "AttributionGraph",
    "EdgeAttribution",
    "IntegratedGradients",
    "Intervened",
    "Lens",
    "Metric",
    "ablate_heads",
    "activation_patching",
    "attribution_graph",
    "attribution_patching",
    "direct_logit_attribution",
    "edge_attribution_patching",
    "frozen",
    "integrated_gradients",
    "intervene",
    "logit_difference",
    "logit_lens",
    "path_patching",
]
