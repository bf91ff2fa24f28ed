"""Transcoders at work on a model: the MLP activations they read and predict, how well they
predict them, and what the model loses with every MLP replaced at once.

    x, y = mlp_activations(model, transcoders.config, windows)   # (n, N, D) each
    transcoder_metrics(transcoders, x, y)    # per layer: normalised MSE, L0, features used
    spliced_losses(model, transcoders, windows)   # the LM's loss, clean and with every MLP
                                                  # replaced by its transcoder
    top_contexts(model, transcoders, windows)     # where each feature fires most: its label

Every layer's input and output come from the same forward pass, which stops after the last
transcoded block (the vocabulary head is not needed). The first position of each window is
left out where the transcoders were trained without it (``skip_first``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save
from torch import Tensor

from glassformer.atomic import write_atomic
from glassformer.errors import CheckpointError, one_line
from glassformer.inspect.features import EnoughError, check_hook
from glassformer.models.base import PretrainedModel
from glassformer.models.gpt import GPT
from glassformer.models.transcoder import TranscoderConfig, Transcoders


def check_transcodable(model: PretrainedModel, config: TranscoderConfig | None = None) -> None:
    """One line unless ``model`` is a decoder-only LM whose blocks add their MLP's output
    to the stream and (given a ``config``) have the hook points the transcoders read and
    predict."""
    if not isinstance(model, GPT):
        raise ValueError(
            f"transcoders replace a decoder-only language model's MLPs; this is a "
            f"{type(model).__name__} (translators' decoders and encoders are not read)"
        )
    if not getattr(model.config, "norm_first", True):
        raise ValueError(
            "transcoders need blocks that add their MLP's output to the stream (pre-norm); "
            "this model normalises after the sum (post-norm)"
        )
    blocks = len(model.blocks)
    if config is None:
        return
    if config.layers[-1] >= blocks:
        raise ValueError(f"the model has blocks 0 … {blocks - 1}; got layers {list(config.layers)}")
    for i in range(config.n_layers):
        check_hook(model, config.hook(i))
        check_hook(model, config.hook(i, "output"))


@torch.no_grad()
def mlp_activations(
    model: GPT, config: TranscoderConfig, windows: Tensor, *, batch: int = 16,
    skip_first: bool = True,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Every transcoded layer's MLP input and output for the token windows (N, T), one row
    per token: two (n, N·T', D) tensors, T' = T − 1 with ``skip_first``."""
    n = config.n_layers
    got: dict[str, Tensor] = {}
    last = config.hook(n - 1, "output")

    def grab(value: Tensor, name: str) -> None:
        got[name] = value.detach().float()
        if name == last:
            raise EnoughError

    names = [config.hook(i, w) for i in range(n) for w in ("input", "output")]
    xs, ys = [], []
    for start in range(0, len(windows), batch):
        with contextlib.suppress(EnoughError):
            model.run_with_hooks(windows[start : start + batch], hooks=[(names, grab)])
        cut = slice(1, None) if skip_first else slice(None)
        xs.append(torch.stack([got[config.hook(i)][:, cut].flatten(0, 1) for i in range(n)]))
        ys.append(torch.stack([got[config.hook(i, "output")][:, cut].flatten(0, 1)
                               for i in range(n)]))  # fmt: skip
    return torch.cat(xs, 1), torch.cat(ys, 1)


@torch.no_grad()
def transcoder_metrics(
    tc: Transcoders, x: Tensor, y: Tensor, *, batch: int = 2048
) -> dict[str, list[float]]:
    """Per layer, how well ``tc`` predicts MLP outputs y from inputs x (n, N, D):
    ``nmse`` (Σ‖y − ŷ‖² / Σ‖y − mean y‖², the fraction of variance unexplained),
    ``l0`` (features firing per token) and ``features_used`` (the share firing at least
    once)."""
    n = tc.config.n_layers
    error, l0 = torch.zeros(n), torch.zeros(n)
    used = torch.zeros(n, tc.config.d_transcoder, dtype=torch.bool)
    for i in range(0, x.size(1), batch):
        out = tc(x[:, i : i + batch])
        on = out.features > 0
        error += (y[:, i : i + batch] - out.outputs).pow(2).sum((1, 2))
        l0 += on.sum((1, 2))
        used |= on.any(1)
    spread = (y - y.mean(1, keepdim=True)).pow(2).sum((1, 2))
    return {
        "nmse": (error / spread).tolist(),
        "l0": (l0 / x.size(1)).tolist(),
        "features_used": used.float().mean(1).tolist(),
    }


def splice_hooks(tc: Transcoders, *, skip_first: bool | None = None) -> list[tuple[str, Any]]:
    """Hooks that replace every transcoded MLP's output by its transcoder's prediction, from
    the input that MLP sees in the same pass (errors compound, as in the replacement
    model); cross-layer features write to later layers as the pass reaches them. The first
    position keeps the model's own output where the set was trained without it."""
    config = tc.config
    skip = config.skip_first if skip_first is None else skip_first
    pending: dict[int, Tensor] = {}  # layer → what earlier layers' features write to it

    def read(i: int) -> Any:
        def hook(value: Tensor, name: str) -> None:
            if i == 0:
                pending.clear()
            z = tc.encode_layer(value, i)
            for o, write in enumerate(tc.writes(z, i)):
                pending[i + o] = pending.get(i + o, 0) + write
            if config.skip:
                pending[i] = pending[i] + value.to(tc.W_skip.dtype) @ tc.W_skip[i].T

        return hook

    def write(i: int) -> Any:
        def hook(value: Tensor, name: str) -> Tensor:
            out = (pending.pop(i) + tc.b_dec[i]).to(value.dtype)
            return torch.cat([value[:, :1], out[:, 1:]], dim=1) if skip else out

        return hook

    return [(config.hook(i), read(i)) for i in range(config.n_layers)] + [
        (config.hook(i, "output"), write(i)) for i in range(config.n_layers)
    ]


@torch.no_grad()
def spliced_losses(model: GPT, tc: Transcoders, windows: Tensor, *, batch: int = 8) -> dict:
    """The model's next-token loss on the windows (N, T), clean and with every transcoded
    MLP replaced at once (``splice_hooks``): ``ce_clean``, ``ce_spliced`` and their
    difference ``ce_increase`` (nats per token)."""
    sums = {"clean": 0.0, "spliced": 0.0}
    for i in range(0, len(windows), batch):
        ids = windows[i : i + batch]
        for key, hooks in (("clean", []), ("spliced", splice_hooks(tc))):
            logits = model.run_with_hooks(ids, hooks=hooks).logits
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
            sums[key] += float(loss) * len(ids)
    clean, spliced = sums["clean"] / len(windows), sums["spliced"] / len(windows)
    return {"ce_clean": clean, "ce_spliced": spliced, "ce_increase": spliced - clean}


@dataclass
class TopContexts:
    """Where each feature fires most in a set of windows: for layer i and feature j, its
    ``n`` highest values ``values[i, j]`` (0 where it fired fewer times) at window
    ``window[i, j]`` and position ``position[i, j]`` of ``windows`` (N, T)."""

    windows: Tensor
    values: Tensor  # (layers, features, n)
    window: Tensor  # (layers, features, n)
    position: Tensor  # (layers, features, n)

    def of(self, layer: int, feature: int) -> list[tuple[float, int, int]]:
        """(value, window, position) of one feature's contexts, highest first."""
        rows = zip(self.values[layer, feature].tolist(), self.window[layer, feature].tolist(),
                   self.position[layer, feature].tolist(), strict=True)  # fmt: skip
        return [(v, int(w), int(p)) for v, w, p in rows if v > 0]

    def save(self, path: Path) -> None:
        tensors = {"windows": self.windows, "values": self.values, "window": self.window,
                   "position": self.position}  # fmt: skip
        write_atomic(path, save({k: v.contiguous() for k, v in tensors.items()}))

    @classmethod
    def load(cls, path: Path, layers: int, features: int) -> TopContexts:
        """The contexts saved at ``path`` for a set of ``layers`` × ``features``; one
        ``CheckpointError`` if the file is not that (damaged, or of another set)."""
        try:
            found = load_file(str(path))
            contexts = cls(found["windows"], found["values"], found["window"], found["position"])
        except Exception as e:  # safetensors raises its own types; a key may be missing
            raise CheckpointError(f"cannot read {path}: {one_line(e)}") from None
        shape = tuple(contexts.values.shape)
        windows = contexts.windows
        fits = windows.dim() == 2 and len(shape) == 3 and shape[:2] == (layers, features)
        fits = fits and contexts.window.shape == shape == contexts.position.shape
        if fits and contexts.window.numel():
            low = min(int(contexts.window.min()), int(contexts.position.min()))
            fits = low >= 0 and int(contexts.window.max()) < len(windows) and int(
                contexts.position.max()) < windows.size(1)  # fmt: skip
        if not fits:
            raise CheckpointError(f"{path} holds the contexts of another set ({shape})")
        return contexts


@torch.no_grad()
def top_contexts(
    model: GPT, tc: Transcoders, windows: Tensor, *, n: int = 5, batch: int = 8
) -> TopContexts:
    """Every feature's ``n`` strongest places in the token windows (N, T) (the first
    position left out where the set skips it): one pass of the model, every layer at once."""
    config = tc.config
    start = 1 if config.skip_first else 0
    layers, features = config.n_layers, config.d_transcoder
    best = torch.zeros(layers, features, n)
    where = torch.zeros(layers, features, n, dtype=torch.long)  # window · T + position
    T = windows.size(1)
    for i in range(0, len(windows), batch):
        chunk = windows[i : i + batch]
        x, _ = mlp_activations(model, config, chunk, skip_first=bool(start))
        z = tc.encode(x)  # (layers, rows, f)
        rows = (torch.arange(len(chunk))[:, None] * T + torch.arange(start, T)).flatten()
        here = z.mT.topk(min(n, z.size(1)), dim=-1)  # this chunk's best, (layers, f, n)
        keep = torch.cat([best, here.values], dim=-1).topk(n, dim=-1)
        places = rows[here.indices] + i * T
        best = keep.values
        where = torch.cat([where, places], dim=-1).gather(-1, keep.indices)
    return TopContexts(windows, best, where // T, where % T)
