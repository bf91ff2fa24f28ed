"""The local replacement model: a model made linear around one input, with transcoders in
place of its MLPs, for attribution graphs (``inspect.graph``) and interventions.

Run a text once, then hold what is not linear at the values that run gave:

- every attention pattern (a head then mixes its values with fixed weights);
- every norm's scale: LayerNorm's 1/σ and RMSNorm's 1/rms, per position (the norm is then
  a fixed linear map: centre, scale by the held factor, times the weight, plus the bias);
- every MLP's output (the transcoders' features and error stand for it).

What remains from the token embeddings to the logits is linear, so a node's *direct
effect* on another is one product: the source's write dotted with the gradient of the
target's read, the gradient taken through the frozen model (Ameisen et al., "Circuit
tracing", 2025). ``frozen(model, ids)`` records the first run and holds it for the block:

    with frozen(model, ids) as held:
        model.run_with_hooks(ids.expand(8, -1), hooks=[...])   # patterns and scales held

Held values are recorded for batch 1 and broadcast over any batch of the same text.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from glassformer.models.base import PretrainedModel
from glassformer.models.gpt import GPT
from glassformer.models.transcoder import Transcoders
from glassformer.modules.norms import LayerNorm, RMSNorm


def norm_scale(norm: LayerNorm | RMSNorm, x: Tensor) -> Tensor:
    """The factor a norm multiplies its (centred) input by, per position: (…, 1)."""
    x = x.float()
    if isinstance(norm, LayerNorm):
        x = x - x.mean(-1, keepdim=True)
    return torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)


def held_norm(norm: LayerNorm | RMSNorm, x: Tensor, scale: Tensor) -> Tensor:
    """The norm as the linear map it is with its scale held: (…, D) → (…, D)."""
    if isinstance(norm, LayerNorm):
        y = (x - x.mean(-1, keepdim=True)) * scale
        if norm.weight is not None:
            y = y * norm.weight
        return y if norm.bias is None else y + norm.bias
    weight = norm.weight + 1.0 if norm.unit_offset else norm.weight
    return x * scale * weight


@dataclass
class Held:
    """What one run recorded: each attention pattern and each norm's scale, by name."""

    patterns: dict[str, Tensor] = field(default_factory=dict)
    scales: dict[str, Tensor] = field(default_factory=dict)


def _norms(model: nn.Module) -> dict[str, LayerNorm | RMSNorm]:
    """The model's norms on the residual stream's path (not the q/k norms inside attention:
    they feed only the patterns, which are held)."""
    return {
        name: module for name, module in model.named_modules()
        if isinstance(module, (LayerNorm, RMSNorm)) and ".attn." not in f".{name}."
    }  # fmt: skip


@contextlib.contextmanager
def frozen(model: PretrainedModel, ids: Tensor, **kwargs: Any) -> Iterator[Held]:
    """Within the block, the model's attention patterns and norm scales are the ones it
    had on ``ids`` (1, T) (see the module's docstring); the values it gives on ``ids``
    are its own to rounding, and its gradients are those of the held, linear model."""
    norms = _norms(model)
    held = Held()
    inputs: dict[str, Tensor] = {}

    def remember_input(name: str) -> Any:
        def pre_hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            inputs[name] = args[0]

        return pre_hook

    handles = [m.register_forward_pre_hook(remember_input(n)) for n, m in norms.items()]
    try:

        def record_scale(value: Tensor, name: str) -> None:
            module = name.removesuffix(".hook_normalized")
            held.scales[module] = norm_scale(norms[module], inputs[module]).detach()

        def record_pattern(value: Tensor, name: str) -> None:
            held.patterns[name] = value.detach()

        record = [(f"{n}.hook_normalized", record_scale) for n in norms]
        with torch.no_grad():
            model.run_with_hooks(ids, hooks=[*record, ("*.hook_pattern", record_pattern)],
                                 **kwargs)  # fmt: skip

        def hold_scale(value: Tensor, name: str) -> Tensor:
            module = name.removesuffix(".hook_normalized")
            x = inputs[module]
            return held_norm(norms[module], x, held.scales[module]).to(value.dtype)

        def hold_pattern(value: Tensor, name: str) -> Tensor:
            return held.patterns[name].expand_as(value)

        hooks = [(f"{n}.hook_normalized", hold_scale) for n in norms]
        with model.hooks([*hooks, ("*.hook_pattern", hold_pattern)]):
            yield held
    finally:
        for handle in handles:
            handle.remove()


# ---- interventions ----------------------------------------------------------------------


@dataclass
class Intervened:
    """A run with features changed: the logits (1, T, V), and every transcoder feature's
    evidence (n, T, d_transcoder) and value (n, T, d_transcoder) as the run had them."""

    logits: Tensor
    evidence: Tensor
    features: Tensor


def intervene(
    model: GPT,
    transcoders: Transcoders,
    ids: Tensor,
    changes: Sequence[tuple[int, int, int, float]] = (),
    *,
    direct: bool = False,
    freeze_attention: bool = True,
    zero_first: bool = True,
    hooks: Sequence[tuple[str, Any]] = (),
) -> Intervened:
    """Run ``ids`` with features set: each change (layer, position, feature, value) sets
    that feature's activation, and the MLP output at its layer (and, cross-layer, at every
    later one) moves by (value − its activation) × its decoder row.

    ``direct=False`` (the default): the model runs on, its own MLPs computing what follows
    (each changed feature's activation read again at its layer, as it is then), the
    attention patterns held where ``freeze_attention``. ``direct=True``: every MLP output,
    attention pattern and norm scale is held at the clean run's, so a change reaches other
    features and the logits only directly (what an attribution graph's edges predict).
    ``hooks``: further (name, fn) pairs for the run (an embedding or error nudged)."""
    ids = ids.reshape(1, -1)
    tc = transcoders.unfolded() if transcoders.config.rescale_acts_by_decoder_norm else transcoders
    config = tc.config
    n = config.n_layers
    by_layer: dict[int, list[tuple[int, int, float]]] = {}
    for layer, pos, feature, value in changes:
        if layer not in config.layers:
            raise ValueError(f"no transcoder at block {layer}; these cover {list(config.layers)}")
        if not (0 <= pos < ids.size(1) and 0 <= feature < config.d_transcoder):
            raise ValueError(
                f"position {pos} or feature {feature} is out of range: the text has "
                f"{ids.size(1)} positions, each layer {config.d_transcoder} features"
            )
        by_layer.setdefault(config.layers.index(layer), []).append((pos, feature, value))
    with torch.no_grad():
        clean = _mlp_values(model, tc, ids)
    deltas = torch.zeros(n, ids.size(1), config.d_model)
    evidence: dict[int, Tensor] = {}
    skips: dict[int, Tensor] = {}

    def read(i: int) -> Any:
        def hook(value: Tensor, name: str) -> None:
            pre = value[0].float() @ tc.W_enc[i].T + tc.b_enc[i]
            evidence[i] = pre
            if direct and config.skip:  # the skip term is linear: it follows its input
                skips[i] = (value[0].float() - clean.inputs[i]) @ tc.W_skip[i].T
            if i in by_layer:
                now = clean.features[i] if direct else tc.choose(pre, i)
                if zero_first:
                    now = torch.cat([torch.zeros_like(now[:1]), now[1:]])
                for pos, feature, target in by_layer[i]:
                    change = torch.zeros_like(now[0])
                    change[feature] = target - now[pos, feature]
                    moved = tc.writes(change, i).to(deltas)  # (outputs, D): i, i + 1, ...
                    deltas[i : i + len(moved), pos] += moved

        return hook

    def write(i: int) -> Any:
        def hook(value: Tensor, name: str) -> Tensor:
            if not direct:
                return value + deltas[i].to(value)
            return (clean.outputs[i] + deltas[i] + skips.get(i, 0.0))[None].to(value)

        return hook

    live = [(config.hook(i), read(i)) for i in range(n)]
    live += [(config.hook(i, "output"), write(i)) for i in range(n)]
    with contextlib.ExitStack() as stack:
        if direct:
            stack.enter_context(frozen(model, ids))
        elif freeze_attention:
            with torch.no_grad():
                _, cache = model.run_with_cache(ids, names="*.hook_pattern")
            held = {name: cache[name] for name in cache}
            live.insert(0, ("*.hook_pattern", lambda value, name: held[name]))
        with torch.no_grad():
            out = model.run_with_hooks(ids, hooks=[*live, *hooks])
    pre = torch.stack([evidence[i] for i in range(n)])
    return Intervened(out.logits, pre, tc.choose(pre))


@dataclass
class _Clean:
    inputs: Tensor  # (n, T, D) each layer's MLP input
    outputs: Tensor  # (n, T, D) each layer's MLP output
    features: Tensor  # (n, T, f)


def _mlp_values(model: GPT, tc: Transcoders, ids: Tensor) -> _Clean:
    config = tc.config
    names = [config.hook(i, w) for w in ("input", "output") for i in range(config.n_layers)]
    _, cache = model.run_with_cache(ids, names=names)
    x = torch.stack([cache[config.hook(i)][0] for i in range(config.n_layers)]).float()
    y = torch.stack([cache[config.hook(i, "output")][0] for i in range(config.n_layers)])
    return _Clean(x, y.float(), tc.encode(x))
