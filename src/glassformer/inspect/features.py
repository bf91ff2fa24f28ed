"""Sparse autoencoders at work on a model: the activations they read, how well they rebuild
them, what splicing them in costs the model, and which texts make a feature fire.

    acts = hook_activations(model, "blocks.15.hook_resid_post", windows)   # (N, d_in)
    reconstruction_metrics(sae, acts)   # explained variance, L0, the share of features used
    spliced_losses(model, sae, windows) # the LM's loss, clean / SAE spliced in / zero-ablated
    top_contexts(model, sae, windows, [12, 40])   # where features 12 and 40 fire most

An activation of more than one trailing dimension (``attn.hook_z``: (B, T, H, Dh)) is read
flattened (H·Dh wide), as SAELens reads hook_z SAEs. The first position of each window is
left out where the SAE was trained without it (``skip_first``: attention sinks).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from glassformer.models.base import PretrainedModel
from glassformer.modules.hooking import hook_points, select


class EnoughError(Exception):
    """Raised by a hook once it has what it came for: the rest of the pass is not run
    (the callers here, probes, transcoders and graphs, suppress it around the pass)."""


def check_hook(model: PretrainedModel, hook: str) -> None:
    """One line if ``model`` has no hook point ``hook`` (with the closest it has)."""
    select(hook_points(model), [hook])


@torch.no_grad()
def hook_activations(
    model: PretrainedModel, hook: str, windows: Tensor, *, batch: int = 16, skip_first: bool = True
) -> Tensor:
    """The activations at ``hook`` for the token windows (N, T), one row per token: (N·T',
    d), T' = T − 1 with ``skip_first``. The pass stops at the hook point."""
    check_hook(model, hook)
    rows = []
    got: dict[str, Tensor] = {}

    def grab(value: Tensor, name: str) -> None:
        got["value"] = value.detach().flatten(2).float()  # (B, T, d)
        raise EnoughError

    for i in range(0, len(windows), batch):
        with contextlib.suppress(EnoughError):
            model.run_with_hooks(windows[i : i + batch], hooks=[(hook, grab)])
        value = got["value"][:, 1:] if skip_first else got["value"]
        rows.append(value.reshape(-1, value.size(-1)))
    return torch.cat(rows)


@torch.no_grad()
def reconstruction_metrics(sae: Any, x: Tensor, *, batch: int = 4096) -> dict[str, float]:
    """How well ``sae`` rebuilds activations x (N, d_in): ``explained_variance`` (1 − Σ‖x −
    x̂‖² / Σ‖x − mean x‖²), ``l0`` (features firing per token), ``mse`` (per token, summed
    over features), and ``features_used`` (the share of features firing at least once)."""
    error = l0 = 0.0
    used = torch.zeros(sae.config.d_sae, dtype=torch.bool)
    for i in range(0, len(x), batch):
        out = sae(x[i : i + batch])
        on = out.features > 0
        error += float((x[i : i + batch] - out.reconstruction).pow(2).sum())
        l0 += float(on.sum())
        used |= on.any(0)
    spread = float((x - x.mean(0)).pow(2).sum())
    return {
        "explained_variance": 1.0 - error / spread,
        "l0": l0 / len(x),
        "mse": error / len(x),
        "features_used": float(used.float().mean()),
    }


def splice_hook(sae: Any, *, skip_first: bool | None = None) -> Any:
    """A hook putting the SAE's reconstruction in place of the activation (of any trailing
    shape), but at the first position if the SAE was trained without it."""
    skip = sae.config.skip_first if skip_first is None else skip_first

    def hook(value: Tensor, name: str) -> Tensor:
        rebuilt = sae(value.flatten(2)).reconstruction.view_as(value)
        if skip:
            rebuilt = torch.cat([value[:, :1], rebuilt[:, 1:]], dim=1)
        return rebuilt

    return hook


@torch.no_grad()
def spliced_losses(
    model: PretrainedModel, sae: Any, windows: Tensor, *, batch: int = 8
) -> dict[str, float]:
    """The model's next-token loss on the windows (N, T): clean, with the SAE's
    reconstruction spliced in at its hook point, and with the activation zero-ablated there;
    ``ce_increase`` = spliced − clean, ``ce_loss_score`` = (zero − spliced) / (zero − clean)
    (1: the SAE costs nothing; 0: as bad as no activation at all; SAELens's score)."""
    hook = sae.config.hook_name
    check_hook(model, hook)
    zero = lambda value, name: torch.zeros_like(value)  # noqa: E731
    sums = {"clean": 0.0, "spliced": 0.0, "zero": 0.0}
    for i in range(0, len(windows), batch):
        ids = windows[i : i + batch]
        for key, hooks in (("clean", []), ("spliced", [(hook, splice_hook(sae))]),
                           ("zero", [(hook, zero)])):  # fmt: skip
            logits = model.run_with_hooks(ids, hooks=hooks).logits
            sums[key] += float(_next_token_loss(logits, ids)) * len(ids)
    ce = {k: v / len(windows) for k, v in sums.items()}
    gap = ce["zero"] - ce["clean"]
    return {
        "ce_clean": ce["clean"],
        "ce_spliced": ce["spliced"],
        "ce_zero_ablated": ce["zero"],
        "ce_increase": ce["spliced"] - ce["clean"],
        "ce_loss_score": (ce["zero"] - ce["spliced"]) / gap if gap else float("nan"),
    }


def _next_token_loss(logits: Tensor, ids: Tensor) -> Tensor:
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())


@torch.no_grad()
def feature_activations(model: PretrainedModel, sae: Any, ids: Tensor) -> Tensor:
    """Every feature's value at every position of one text's ids (1, T) or (T,): (T, d_sae)."""
    acts = hook_activations(model, sae.config.hook_name, ids.view(1, -1), skip_first=False)
    return sae.encode(acts)


@dataclass(frozen=True)
class Context:
    """Where a feature fired: window ``window``, position ``position``, with ``value``."""

    window: int
    position: int
    value: float


@torch.no_grad()
def top_contexts(
    model: PretrainedModel,
    sae: Any,
    windows: Tensor,
    features: list[int],
    *,
    n: int = 5,
    batch: int = 16,
    activations: Tensor | None = None,
) -> dict[int, list[Context]]:
    """For each of ``features``, the ``n`` places in the windows (N, T) where it fires most.
    ``activations``: the windows' own at the SAE's hook point, as ``hook_activations`` gives
    them with the SAE's ``skip_first``, if already at hand (else the model runs again)."""
    best: dict[int, list[Context]] = {f: [] for f in features}
    start = 1 if sae.config.skip_first else 0
    rows = windows.size(1) - start  # activations per window
    for i in range(0, len(windows), batch):
        chunk = windows[i : i + batch]
        if activations is None:
            acts = hook_activations(model, sae.config.hook_name, chunk, skip_first=bool(start))
        else:
            acts = activations[i * rows : (i + len(chunk)) * rows]
        z = sae.encode(acts).view(len(chunk), rows, -1)[..., features]
        for j, feature in enumerate(features):
            values, where = z[..., j].flatten().topk(min(n, z[..., j].numel()))
            for value, place in zip(values.tolist(), where.tolist(), strict=True):
                if value > 0:
                    w, p = divmod(place, z.size(1))
                    best[feature].append(Context(i + w, p + start, value))
    return {f: sorted(c, key=lambda c: -c.value)[:n] for f, c in best.items()}
