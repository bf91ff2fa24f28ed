"""Hook points: named places in a model where an intermediate value can be read or replaced.

Every module places a ``HookPoint`` on each value worth looking at (``hook_q``,
``hook_pattern``, ``hook_resid_mid``, ...). A hook point is an identity, and an unused one
costs one attribute test: it is a plain attribute, not a module. With functions attached,
each gets ``(value, name)`` and may return a replacement (None keeps the value). A hook
point's name is its module's path and its attribute (``blocks.3.attn.hook_pattern``);
every model kind names its activations alike (docs/hooks.md has the table).

Finding hook points by name, attaching functions to them for a block of code, their
gradients and the cache ``run_with_cache`` returns are ``modules.hooking``'s: a forward
passes only through the ``HookPoint`` here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor

HookFn = Callable[[Tensor, str], Tensor | None]
# Hook points a cache of "everything" leaves out: each is many times its layer's output.
OPT_IN = ("hook_result",)
# Which hook points: a list of names, a glob pattern ("*.hook_pattern"), or a predicate.
Names = Sequence[str] | str | Callable[[str], bool] | None


class HookPoint:
    """An identity with a name, until functions are attached: then each one sees the value
    (and the name) and may return a replacement.

    A hook point is not an ``nn.Module``: it holds no weights and does no work of its own,
    so a model's module tree (and ``print(model)``) shows only what computes, and reading
    one is a plain attribute lookup. ``hook_points`` finds them among each module's
    attributes."""

    def __init__(self) -> None:
        self.name = ""  # set by hook_points(): its path in the model
        self.fns: list[HookFn] = []

    @property
    def active(self) -> bool:
        return bool(self.fns)

    def __call__(self, value: Tensor) -> Tensor:
        if not self.fns:  # the common case, kept to one test
            return value
        for fn in self.fns:
            out = fn(value, self.name)
            if out is not None:
                value = out
        return value

    def __repr__(self) -> str:
        hooks = f", {len(self.fns)} hook(s)" if self.fns else ""
        return f"HookPoint({self.name!r}{hooks})"
