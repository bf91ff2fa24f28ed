"""Looking inside a model through its hook points (``model.run_with_cache``,
``model.run_with_hooks``): the logit lens, direct logit attribution, activation patching
and head ablation.

    lens = logit_lens(model, ids)                    # each layer's guess at every position
    parts = direct_logit_attribution(model, ids)     # the final logits, split by component
    effect = activation_patching(model, clean, corrupt, logit_difference(a, b))
"""

from glassformer.inspect.lens import Attribution, Lens, direct_logit_attribution, logit_lens
from glassformer.inspect.patching import (
    Metric,
    ablate_heads,
    activation_patching,
    logit_difference,
)

# the cache run_with_cache returns lives with the hook points (models return it)
from glassformer.modules.hooks import ActivationCache

__all__ = [
    "ActivationCache",
    "Attribution",
    "Lens",
    "Metric",
    "ablate_heads",
    "activation_patching",
    "direct_logit_attribution",
    "logit_difference",
    "logit_lens",
]
