"""Path patching: does head A matter to head B, or only on its own? (Wang et al., 2022)

Activation patching asks what one component does to the answer by every route at once.
Path patching asks it of one route: from sender heads to receiver heads' queries, keys or
values (or straight to the logits). On the clean input:

1. every head's output (``hook_z``) is held at its clean value, except the senders', which
   take their values from the corrupted input; the MLPs compute as they will. The
   receivers' q, k or v are recorded: they now see the senders' change through the residual
   stream and nothing else's.
2. the clean input runs again, free, with only the receivers' recorded q/k/v put in place.
   The metric of that run is the path's answer.

With no receivers, step 1's own metric is the answer (the senders' change reaching the
logits without passing another head). ``path_patching(senders=None)`` tries each head
before the receivers as the sender in turn: a map of where the receivers' input comes from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from glassformer.inspect.patching import Inputs, Metric, _logits, check_pair, per_layer
from glassformer.models.base import PretrainedModel

Head = tuple[int, int]  # (layer, head), counting from 0


@torch.no_grad()
def path_patching(
    model: PretrainedModel,
    clean: Inputs,
    corrupt: Inputs,
    metric: Metric,
    *,
    senders: Sequence[Head] | None = None,
    receivers: Sequence[Head] | None = None,
    receiver_input: str = "v",
    stack: str | None = None,
) -> Tensor:
    """The metric of the clean run when only the path senders → receivers carries the
    corrupted input (see the module's docstring).

    Args:
        model: any glassformer model with blocks (a translator: ``stack``).
        clean: one example's inputs (the run that is kept).
        corrupt: the same shapes, changed (where the senders' outputs come from).
        metric: the model's logits → a 0-d tensor (``logit_difference``).
        senders: the heads whose output comes from the corrupted run; None tries every head
            before the first receiver, one at a time.
        receivers: the heads whose input is patched; None: the logits.
        receiver_input: which of the receivers' inputs: any of ``"q"``, ``"k"``, ``"v"``
            (``"qk"``: the pattern).
        stack: whose blocks: None, "encoder" or "decoder".

    Returns:
        a 0-d tensor for given senders; for ``senders=None`` (L, H), NaN where a head is not
        before every receiver.
    """
    clean, corrupt = check_pair(clean, corrupt)
    z_names = per_layer(model, "attn.hook_z", stack)
    if not receiver_input or set(receiver_input) - set("qkv"):
        raise ValueError(f"receiver_input takes letters of 'qkv', got {receiver_input!r}")
    _, clean_z = model.run_with_cache(*clean, names=z_names)
    _, corrupt_z = model.run_with_cache(*corrupt, names=z_names)
    heads = clean_z[z_names[0]].size(2)
    for layer, head in [*(senders or []), *(receivers or [])]:
        if not (0 <= layer < len(z_names) and 0 <= head < heads):
            raise ValueError(
                f"head ({layer}, {head}) does not exist: the model has {len(z_names)} layers "
                f"of {heads} heads"
            )
    route = _Route(model, clean, metric, z_names, clean_z, corrupt_z, stack)
    if senders is not None:
        return route.through(list(senders), receivers, receiver_input)
    first = min((layer for layer, _ in receivers or []), default=len(z_names))
    sweep = torch.full((len(z_names), heads), float("nan"))
    for layer in range(first):
        for head in range(heads):
            sweep[layer, head] = route.through([(layer, head)], receivers, receiver_input)
    return sweep


class _Route:
    """The clean run, its heads' outputs and the corrupted run's, for one path at a time."""

    def __init__(self, model, clean, metric, z_names, clean_z, corrupt_z, stack) -> None:
        self.model, self.clean, self.metric, self.z_names = model, clean, metric, z_names
        self.clean_z, self.corrupt_z = clean_z, corrupt_z
        # each block's q, k and v hook points, found once for every path a sweep tries
        self.names = {x: per_layer(model, f"attn.hook_{x}", stack) for x in "qkv"}

    def through(self, senders: list[Head], receivers: Sequence[Head] | None, inputs: str) -> Tensor:
        def hold(value: Tensor, name: str) -> Tensor:
            layer = self.z_names.index(name)
            held = self.clean_z[name].clone()
            for sender_layer, head in senders:
                if sender_layer == layer:
                    held[:, :, head] = self.corrupt_z[name][:, :, head]
            return held

        names = self.names
        read = sorted({names[x][layer] for x in inputs for layer, _ in receivers or []})
        output, seen = self._held([(self.z_names, hold)], read)
        if not receivers:
            return torch.as_tensor(float(self.metric(_logits(output))))

        def put(value: Tensor, name: str) -> Tensor:
            x = name.rsplit("_", 1)[-1]  # "blocks.3.attn.hook_v" → "v"
            layer = names[x].index(name)
            value = value.clone()
            group = self.clean_z[self.z_names[0]].size(2) // value.size(
                2
            )  # query heads per kv head
            for receiver_layer, head in receivers:
                if receiver_layer == layer:
                    value[:, :, head // group] = seen[name][:, :, head // group]
            return value

        output = self.model.run_with_hooks(*self.clean, hooks=[(read, put)])
        return torch.as_tensor(float(self.metric(_logits(output))))

    def _held(self, hooks: list, read: list[str]) -> tuple[Any, dict[str, Tensor]]:
        """The clean run with the heads held (``hooks``), and the values at ``read``."""
        seen: dict[str, Tensor] = {}

        def keep(value: Tensor, name: str) -> None:
            seen[name] = value.clone()

        watching = [*hooks, (read, keep)] if read else hooks
        output = self.model.run_with_hooks(*self.clean, hooks=watching)
        return output, seen
