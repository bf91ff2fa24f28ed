"""Linear probes and steering vectors: where a concept is, and moving it.

A probe reads one hook point. Each text becomes one vector there: the mean of the hook's
value over the text's tokens (``features="mean"``) or its last token's (``"last"``); a text
longer than ``max_tokens`` keeps its last ``max_tokens`` tokens (where a review's verdict
usually is; ``keep="start"`` keeps the first). The vectors are standardised with the
training set's mean and spread, and a logistic regression with an L2 penalty learns the
label from them, the objective of scikit-learn's ``LogisticRegression(C=c)``:

    ½‖w‖² + C · Σᵢ log(1 + exp(−yᵢ (w·xᵢ + b)))        (the intercept b not penalised)

solved by L-BFGS in float64 to a gradient of 1e-9, so that its probabilities are
scikit-learn's for the same features. ``train_probe`` fits one probe per hook point a pattern
picks (``"blocks.*.hook_resid_post"``) from one pass of the model over the texts.

A steering vector is a direction added to a hook point while the model runs:
``steering_vector`` is the difference of the mean features of two sets of texts, and
``add(vector, alpha)`` the hook that adds alpha times it at every position
(``model.hooks([(hook, add(vector, 4.0))])``; ``glassformer generate --steer``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from glassformer.inspect.features import EnoughError
from glassformer.models.base import PretrainedModel
from glassformer.modules.hooking import hook_points, select

FEATURES = ("mean", "last")


@dataclass(frozen=True)
class Probe:
    """A logistic regression on one hook point: P(``labels[1]``) = σ(w·(x − mean)/scale + b).
    ``accuracy`` is on the held-out texts (None without them)."""

    hook: str
    weight: Tensor  # (D,), on the standardised features
    bias: float
    mean: Tensor  # (D,)
    scale: Tensor  # (D,)
    labels: tuple[str, str]
    accuracy: float | None = None

    def probabilities(self, features: Tensor) -> Tensor:
        """P(labels[1]) for each row of ``features`` (N, D)."""
        x = (features.double() - self.mean) / self.scale
        return torch.sigmoid(x @ self.weight + self.bias)

    @property
    def direction(self) -> Tensor:
        """The probe's direction in the hook's own units (w / scale), of unit length."""
        d = self.weight / self.scale
        return (d / d.norm()).float()


@dataclass(frozen=True)
class Probes:
    """One probe per hook point, with the difference of each hook's class means (the
    steering vector from labels[0] to labels[1]) and what they were made from."""

    probes: dict[str, Probe]
    differences: dict[str, Tensor]
    about: dict[str, Any]

    @property
    def best(self) -> Probe:
        """The probe of the highest held-out accuracy (the first of equals)."""
        return max(self.probes.values(), key=lambda p: p.accuracy or 0.0)

    def save(self, path: str | Path) -> Path:
        """One safetensors file: per hook, the probe and the class difference; the metadata
        holds the hooks, the labels, the accuracies and ``about`` (model, data, features)."""
        tensors: dict[str, Tensor] = {}
        for hook, p in self.probes.items():
            tensors |= {f"{hook}.weight": p.weight, f"{hook}.bias": torch.tensor([p.bias]),
                        f"{hook}.mean": p.mean, f"{hook}.scale": p.scale,
                        f"{hook}.difference": self.differences[hook]}  # fmt: skip
        accuracy = {h: p.accuracy for h, p in self.probes.items()}
        meta = {"hooks": list(self.probes), "labels": list(self.best.labels),
                "accuracy": accuracy, **self.about}  # fmt: skip
        path = Path(path)
        temporary = path.with_name(f".{path.name}.tmp")
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(temporary),
                  metadata={"glassformer": json.dumps(meta)})  # fmt: skip
        temporary.replace(path)
        return path


def check_features(features: str, max_tokens: int, keep: str) -> None:
    if features not in FEATURES:
        raise ValueError(f"features must be one of {', '.join(FEATURES)}, got {features!r}")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    if keep not in ("end", "start"):
        raise ValueError(f"keep must be 'end' or 'start', got {keep!r}")


@torch.no_grad()
def text_features(
    model: PretrainedModel,
    tokenizer: Any,
    texts: Sequence[str],
    hooks: str | Sequence[str],
    *,
    features: str = "mean",
    max_tokens: int = 64,
    keep: str = "end",
    batch_size: int = 16,
) -> dict[str, Tensor]:
    """Each text's vector at each hook point: {hook: (N, D)}, float32. Texts are run in
    batches of similar lengths, padded on the right (a causal model's real tokens never see
    the padding); the pass stops after the last hook point."""
    check_features(features, max_tokens, keep)
    names = select(hook_points(model), hooks if isinstance(hooks, str) else list(hooks))
    ids = [_cut(tokenizer.encode(text), max_tokens, keep) for text in texts]
    empty = [i for i, row in enumerate(ids) if not row]
    if empty:
        raise ValueError(f"text {empty[0]} has no tokens: a probe reads at least one")
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out = {name: torch.zeros(len(ids), 0) for name in names}
    last = names[-1]
    got: dict[str, Tensor] = {}

    def grab(value: Tensor, name: str) -> None:
        got[name] = value.detach().flatten(2).float()
        if name == last:
            raise EnoughError

    for lo in range(0, len(order), batch_size):
        rows = order[lo : lo + batch_size]
        width = max(len(ids[i]) for i in rows)
        batch = torch.tensor([ids[i] + [ids[i][-1]] * (width - len(ids[i])) for i in rows])
        with contextlib.suppress(EnoughError):
            model.run_with_hooks(batch, hooks=[(names, grab)])
        lengths = torch.tensor([len(ids[i]) for i in rows])
        real = (torch.arange(width)[None] < lengths[:, None]).float()  # (b, T)
        for name in names:
            value = got[name]
            if out[name].size(1) == 0:
                out[name] = torch.zeros(len(ids), value.size(-1))
            if features == "mean":
                pooled = (value * real[..., None]).sum(1) / lengths[:, None]
            else:
                pooled = value[torch.arange(len(rows)), lengths - 1]
            out[name][rows] = pooled
    return out


def _cut(ids: list[int], max_tokens: int, keep: str) -> list[int]:
    return ids[-max_tokens:] if keep == "end" else ids[:max_tokens]


def fit_logistic(x: Tensor, y: Tensor, c: float = 1.0) -> tuple[Tensor, float]:
    """(w, b) minimising ½‖w‖² + c·Σ log(1 + exp(−ỹ(w·x + b))), ỹ = ±1, in float64 by
    L-BFGS: scikit-learn's ``LogisticRegression(C=c)``'s objective."""
    if not c > 0:
        raise ValueError(f"c (the inverse of the L2 penalty) must be positive, got {c!r}")
    x, sign = x.double(), y.double() * 2 - 1
    w = torch.zeros(x.size(1) + 1, dtype=torch.float64, requires_grad=True)
    solver = torch.optim.LBFGS([w], lr=1, max_iter=2000, tolerance_grad=1e-9,
                               tolerance_change=1e-14, history_size=20,
                               line_search_fn="strong_wolfe")  # fmt: skip

    def objective() -> Tensor:
        solver.zero_grad()
        margin = sign * (x @ w[:-1] + w[-1])
        loss = 0.5 * w[:-1].pow(2).sum() + c * torch.nn.functional.softplus(-margin).sum()
        loss.backward()
        return loss

    solver.step(objective)
    found = w.detach()
    return found[:-1], float(found[-1])


def train_probe(
    model: PretrainedModel,
    tokenizer: Any,
    train: Sequence[tuple[str, str]],
    test: Sequence[tuple[str, str]] = (),
    *,
    hook: str | Sequence[str] = "blocks.*.hook_resid_post",
    features: str = "mean",
    max_tokens: int = 64,
    keep: str = "end",
    c: float = 1.0,
    batch_size: int = 16,
) -> Probes:
    """A probe per hook point (a name, a list or a pattern) from labelled texts (text,
    label) with two labels; held-out accuracy on ``test``. See the module's docstring."""
    labels = sorted({label for _, label in train})
    if len(labels) != 2:
        raise ValueError(f"a probe learns two labels; the training texts have {len(labels)}: "
                         f"{', '.join(map(repr, labels[:5]))}")  # fmt: skip
    unknown = sorted({label for _, label in test} - set(labels))
    if unknown:
        raise ValueError(f"test label {unknown[0]!r} is not among the training labels {labels}")
    texts = [t for t, _ in train] + [t for t, _ in test]
    found = text_features(model, tokenizer, texts, hook, features=features,
                          max_tokens=max_tokens, keep=keep, batch_size=batch_size)  # fmt: skip
    y = torch.tensor([labels.index(label) for _, label in train])
    y_test = torch.tensor([labels.index(label) for _, label in test])
    probes, differences = {}, {}
    for name, x_all in found.items():
        x, x_test = x_all[: len(train)].double(), x_all[len(train) :].double()
        mean, scale = x.mean(0), x.std(0).clamp_min(1e-8)
        w, b = fit_logistic((x - mean) / scale, y, c)
        probe = Probe(name, w, b, mean, scale, (labels[0], labels[1]))
        accuracy = None
        if len(test):
            accuracy = float(((probe.probabilities(x_test) > 0.5) == y_test.bool()).double().mean())
        probes[name] = Probe(name, w, b, mean, scale, (labels[0], labels[1]), accuracy)
        differences[name] = (x[y == 1].mean(0) - x[y == 0].mean(0)).float()
    about = {"features": features, "max_tokens": max_tokens, "keep": keep, "c": c,
             "train": len(train), "test": len(test)}  # fmt: skip
    return Probes(probes, differences, about)


def steering_vector(
    model: PretrainedModel,
    tokenizer: Any,
    positive: Sequence[str],
    negative: Sequence[str],
    hook: str,
    *,
    features: str = "mean",
    max_tokens: int = 64,
) -> Tensor:
    """The mean feature of the ``positive`` texts minus that of the ``negative`` ones at
    ``hook`` (D,): added while the model runs, it moves the model from the second towards
    the first."""
    if not positive or not negative:
        raise ValueError("a steering vector needs texts on both sides")
    found = text_features(model, tokenizer, [*positive, *negative], [hook], features=features,
                          max_tokens=max_tokens)[hook]  # fmt: skip
    return found[: len(positive)].mean(0) - found[len(positive) :].mean(0)


def add(vector: Tensor, alpha: float) -> Callable[[Tensor, str], Tensor | None]:
    """A hook function adding ``alpha · vector`` to the value at every position; alpha 0
    leaves the value as it is (no hook at all, to the bit)."""

    def steer(value: Tensor, name: str) -> Tensor | None:
        if value.size(-1) != vector.numel():
            raise ValueError(f"the vector has {vector.numel()} values; {name} is "
                             f"{value.size(-1)} wide")  # fmt: skip
        if alpha == 0:
            return None
        return value + alpha * vector.to(value)

    return steer


def read_vector(path: str | Path, hook: str | None = None) -> tuple[str, Tensor, dict[str, Any]]:
    """(hook, vector, metadata) from a probes file: the class difference at ``hook``, or at
    the hook of the best held-out accuracy."""
    tensors, meta = read_probes(path)
    hook = best_hook(meta) if hook is None else hook
    key = f"{hook}.difference"
    if key not in tensors:
        raise ValueError(f"{path} holds no vector at {hook!r}; it has {', '.join(meta['hooks'])}")
    return str(hook), tensors[key], meta


def read_probes(path: str | Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """(tensors, metadata) of a probes file ``glassformer probe`` wrote, or one line on why
    the file is not one: its metadata names its hooks (strings) and their accuracies."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} is not a file")
    try:
        from safetensors import safe_open

        with safe_open(str(path), "pt") as f:
            meta = json.loads((f.metadata() or {}).get("glassformer", "null"))
        tensors = load_file(str(path))
    except Exception as err:  # noqa: BLE001  (a file that is no safetensors: one line)
        raise ValueError(f"{path} is not a probes file: {err}") from None
    hooks = meta.get("hooks") if isinstance(meta, dict) else None
    accuracy = meta.get("accuracy", {}) if isinstance(meta, dict) else None
    if (not isinstance(hooks, list) or not hooks or not all(isinstance(h, str) for h in hooks)
            or not isinstance(accuracy, dict)):  # fmt: skip
        raise ValueError(f"{path} is not a probes file written by glassformer probe")
    meta["accuracy"] = {h: a for h, a in accuracy.items() if isinstance(a, (int, float))}
    labels = meta.get("labels")
    named = isinstance(labels, list) and len(labels) == 2
    if not named or not all(isinstance(x, str) for x in labels):
        meta["labels"] = ["class 0", "class 1"]
    return tensors, meta


def best_hook(meta: dict[str, Any]) -> str:
    """The hook of a probes file's best held-out accuracy (the first of equals)."""
    return max(meta["hooks"], key=lambda h: meta["accuracy"].get(h) or 0.0)


@torch.no_grad()
def projections(model: PretrainedModel, ids: Tensor, path: str | Path) -> dict[str, Any]:
    """Each token's value at each hook of a probes file, along that hook's class difference
    d and measured from the training texts' mean m: (x − m)·d/‖d‖, positive on the side of
    ``labels[1]``. {"hooks", "values" (hooks, T), "labels", "accuracy", "best"}."""
    tensors, meta = read_probes(path)
    hooks = [h for h in meta["hooks"] if f"{h}.difference" in tensors and f"{h}.mean" in tensors]
    if not hooks:
        raise ValueError(f"{path} holds no class difference with its mean")
    _, cache = model.run_with_cache(ids, names=hooks)
    rows = []
    for hook in hooks:
        value = cache[hook][0].flatten(1).float()  # (T, D)
        d, m = tensors[f"{hook}.difference"].float(), tensors[f"{hook}.mean"].float()
        if d.shape != (value.size(1),) or m.shape != d.shape:
            raise ValueError(f"{path}: the vector at {hook} has {d.numel()} values; the "
                             f"model's {hook} is {value.size(1)} wide")  # fmt: skip
        rows.append((value - m) @ (d / d.norm().clamp_min(1e-12)))
    return {"hooks": hooks, "values": torch.stack(rows), "labels": meta["labels"],
            "accuracy": meta["accuracy"], "best": best_hook({**meta, "hooks": hooks})}  # fmt: skip
