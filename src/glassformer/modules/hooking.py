"""Attaching to hook points: found by name, functions attached for a block, gradients, caches.

    with attach_hooks(model, [("blocks.0.attn.hook_pattern", print_shape)]):
        model(ids)

``ActivationCache`` is what ``run_with_cache`` gives back: the values by name, and with
``grads=`` the gradient of a metric at each of them (``<name>_grad``, TransformerLens's key).

Backward hooks see the gradient flowing back through a hook point: ``fn(grad, name)``, which
may return a replacement gradient. They are attached through the forward pass
(``backward_hooks``): the hook point's value registers ``fn`` on its gradient as it passes.
The hook point itself is ``modules.hooks``'s ``HookPoint``.
"""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from glassformer.modules.hooks import OPT_IN, HookFn, HookPoint, Names

__all__ = [
    "OPT_IN",
    "ActivationCache",
    "HookFn",
    "HookPoint",
    "Names",
    "attach_hooks",
    "differentiable",
    "gradients",
    "hook_points",
    "on_gradient",
    "select",
]


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """The model's hook points by name, each module's (in the module tree's order) after
    its own name: ``blocks.3.attn.hook_pattern`` is the attribute ``hook_pattern`` of the
    module ``blocks.3.attn``. The names are set on the points as they are found."""
    points = {}
    for prefix, module in model.named_modules():
        for attribute, value in vars(module).items():
            if isinstance(value, HookPoint):
                name = f"{prefix}.{attribute}" if prefix else attribute
                value.name = name
                points[name] = value
    return points


def select(points: Mapping[str, HookPoint], names: Names) -> list[str]:
    """The names ``names`` picks among ``points`` (all of them for None).

    Raises:
        ValueError: a listed name the model does not have (with the closest it has), or a
            pattern that matches nothing.
    """
    if names is None:
        return list(points)
    if callable(names):
        return [n for n in points if names(n)]
    if isinstance(names, str):
        picked = [n for n in points if fnmatch.fnmatchcase(n, names)]
        if not picked:
            raise ValueError(f"no hook point matches {names!r}{_close(names, points)}")
        return picked
    for name in names:
        if name not in points:
            raise ValueError(f"the model has no hook point {name!r}{_close(name, points)}")
    return list(names)


def _close(name: str, points: Mapping[str, HookPoint]) -> str:
    match = difflib.get_close_matches(name, list(points), n=1, cutoff=0.5)
    return f"; did you mean {match[0]!r}?" if match else f" ({len(points)} exist: hook_names())"


def differentiable(value: Tensor) -> Tensor:
    """``value`` itself when gradients reach it, else a detached copy that asks for them (a
    frozen or inference model's activations): the rest of the pass is built on that copy,
    so a gradient arrives there and at every hook point after it."""
    if value.requires_grad or not value.is_floating_point():
        return value
    return value.detach().requires_grad_()


def on_gradient(fn: HookFn) -> HookFn:
    """A forward hook that attaches ``fn`` to its value's gradient: the backward pass calls
    ``fn(grad, name)`` there, and a tensor it returns replaces the gradient that flows on.
    Outside ``torch.enable_grad()`` (``no_grad``, ``inference_mode``) there is no backward
    pass and the hook does nothing."""

    def forward(value: Tensor, name: str) -> Tensor | None:
        if not torch.is_grad_enabled() or not value.is_floating_point():
            return None
        value = differentiable(value)
        value.register_hook(lambda grad: fn(grad, name))
        return value

    return forward


@contextlib.contextmanager
def attach_hooks(
    model: nn.Module,
    hooks: Sequence[tuple[Names, HookFn]],
    backward: Sequence[tuple[Names, HookFn]] = (),
) -> Iterator[None]:
    """Attach ``(names, fn)`` pairs for the duration of the block, and the ``backward``
    pairs to the gradients at those names (``on_gradient``); they are removed after it,
    whatever happens in it."""
    points = hook_points(model)
    attached: list[tuple[HookPoint, HookFn]] = []
    hooks = [*hooks, *((names, on_gradient(fn)) for names, fn in backward)]
    try:
        for names, fn in hooks:
            for name in select(points, names):
                points[name].fns.append(fn)
                attached.append((points[name], fn))
        yield
    finally:
        for point, fn in attached:
            point.fns.remove(fn)


def gradients(
    metric: Tensor, values: Mapping[str, Tensor], *, retain_graph: bool = False
) -> dict[str, Tensor]:
    """``{name + "_grad": d metric / d value}`` for each of ``values`` (tensors of the pass
    that computed ``metric``, a scalar); zeros where the metric does not depend on a value
    (a later position under a causal mask). The parameters' ``.grad`` are left alone;
    ``retain_graph`` keeps the pass's graph for more products with it."""
    if metric.numel() != 1 or not metric.is_floating_point():
        raise ValueError(
            f"the gradients are of one number: the metric gave a tensor of shape "
            f"{tuple(metric.shape)} ({metric.dtype}); reduce it (.sum(), a logit difference)"
        )
    if not metric.requires_grad:
        raise ValueError("the metric does not depend on the cached activations")
    names = [n for n, v in values.items() if v.requires_grad]
    found = torch.autograd.grad(
        metric.reshape(()), [values[n] for n in names], allow_unused=True, retain_graph=retain_graph
    )
    grads = {n: torch.zeros_like(v) for n, v in values.items()}  # unreached: zero
    grads.update({n: g for n, g in zip(names, found, strict=True) if g is not None})
    return {f"{n}_grad": g for n, g in grads.items()}


class ActivationCache(Mapping[str, Tensor]):
    """The values a run went through, by hook-point name (a read-only mapping).

    ``stack("blocks.*.hook_resid_post")`` stacks one name over the layers (the
    ``*`` is the layer index) into (L, ...); ``to(device or dtype)`` moves every value.
    """

    def __init__(self, values: Mapping[str, Tensor]) -> None:
        self._values = dict(values)

    def __getitem__(self, name: str) -> Tensor:
        if name not in self._values:
            match = difflib.get_close_matches(name, list(self._values), n=1, cutoff=0.5)
            hint = f"; did you mean {match[0]!r}?" if match else ""
            raise KeyError(f"{name!r} is not in the cache{hint}")
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def stack(self, pattern: str) -> Tensor:
        """The values of ``pattern`` with its ``*`` standing for the layer index, stacked in
        layer order: (L, ...)."""
        if pattern.count("*") != 1:
            raise ValueError(f"the pattern needs one * for the layer index, got {pattern!r}")
        regex = re.compile(re.escape(pattern).replace(r"\*", r"(\d+)") + "$")
        found = sorted((int(m.group(1)), name) for name in self._values if (m := regex.match(name)))
        if not found:
            raise KeyError(f"nothing in the cache matches {pattern!r}")
        return torch.stack([self._values[name] for _, name in found])

    def to(self, *args: Any, **kwargs: Any) -> ActivationCache:
        """Every value moved or cast, as ``Tensor.to`` takes it."""
        return ActivationCache({k: v.to(*args, **kwargs) for k, v in self._values.items()})

    def nbytes(self) -> int:
        """The bytes the values hold."""
        return sum(v.numel() * v.element_size() for v in self._values.values())

    def __repr__(self) -> str:
        lines = [f"ActivationCache({len(self)} values, {self.nbytes() / 2**20:.1f} MiB)"]
        lines += [f"  {name}: {tuple(v.shape)}" for name, v in list(self._values.items())[:12]]
        if len(self) > 12:
            lines.append(f"  ... and {len(self) - 12} more")
        return "\n".join(lines)
