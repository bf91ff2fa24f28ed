"""Sparse autoencoders: a TopK SAE learns to rebuild one hook point's activations of a model.

The model (``--model``: a run directory or a packaged one, SmolLM2 included) stays frozen;
it reads windows of the text (``--block-size`` tokens) and its activations at ``--hook``
(the pass stopped there) are the SAE's training data, one row per token but the first of
each window. They come a region of windows at a time (``REGION_WINDOWS``), each served
shuffled ``PASSES`` times (the model costs ~3× what the SAE's step does). Evaluation is
the explained variance and L0 on validation activations, the dead share, and the model's
loss with the SAE spliced in; the held-out report adds the zero-ablated loss and SAELens's
score on the test text; the show is the busiest features' top contexts, and
``features.png`` the features' firing frequencies.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from glassformer.data.images import ImageProcessor
from glassformer.data.tokenizers import Tokenizer
from glassformer.inspect.features import (
    check_hook,
    hook_activations,
    reconstruction_metrics,
    spliced_losses,
    top_contexts,
)
from glassformer.models.sae import SAEConfig, SparseAutoencoder
from glassformer.training.config import RunConfig, filled
from glassformer.training.distributed import Distributed
from glassformer.training.tasks.common import Task, load_splits, tokenizer_files

REGION_WINDOWS = 512  # windows whose activations are computed together
PASSES = 2  # shuffled passes over each region
VAL_WINDOWS, SPLICE_WINDOWS, TEST_WINDOWS = 48, 8, 32


def build(
    config: RunConfig,
    *,
    tokenizer: Tokenizer | ImageProcessor | None = None,
    labels: list[str] | None = None,
    world: Distributed,
) -> SAETask:
    """The frozen model, its activations at the hook point as batches, and a TopK SAE of
    their width (``--features`` of them, ``--k`` active)."""
    from glassformer.inference import load_run

    if world.enabled:
        raise ValueError("train sae runs in one process (its data is one model's activations)")
    model, tok = load_run(str(config.model))
    model.eval().requires_grad_(False)
    hook = str(config.hook)
    check_hook(model, hook)
    train_text, val_text, test_text, description = load_splits(config)
    block = config.block_size
    train, val = windows(tok, train_text, block), windows(tok, val_text, block)
    if len(train) < 2 or len(val) < 1:
        raise ValueError(f"need at least 3 windows of {block} tokens; give more text")
    val_acts = hook_activations(model, hook, val[:VAL_WINDOWS])
    d_in = val_acts.size(1)
    mean = val_acts.mean(0)
    sae = SparseAutoencoder(SAEConfig(
        d_in=d_in, d_sae=config.features or 8 * d_in, k=filled(config.k),
        rescale_acts_by_decoder_norm=True, model_name=str(config.model), hook_name=hook,
        context_size=block, dataset_path=config.corpus or str(config.data)))  # fmt: skip
    with torch.no_grad():
        sae.b_dec.copy_(mean)  # the activations' centre (Gao et al. take the median)
    variance = float((val_acts - mean).pow(2).sum(-1).mean())  # the loss's unit: FVU
    return SAETask(
        config=config,
        tokenizer=tok,
        model=sae,
        batches=ActivationBatches(model, hook, train, filled(config.batch_size), config.seed),
        loss_fn=partial(_loss, variance=variance),
        extra_files=tokenizer_files(tok),
        description=f"{description}; {hook} of {config.model}, {d_in} wide",
        lm=model,
        val_acts=val_acts,
        val_windows=val,
        test_windows=windows(tok, test_text, block) if test_text else val,
    )


def _loss(sae: Any, batch: Tensor, variance: float) -> tuple[Tensor, int]:
    """The summed loss of a batch of activations and their number (the loop's contract)."""
    return sae.training_loss(batch, variance), len(batch)


def windows(tokenizer: Tokenizer, text: str, block: int) -> Tensor:
    """The text's tokens cut into windows of ``block``: (N, block)."""
    ids = torch.tensor(tokenizer.encode(text), dtype=torch.long)
    n = len(ids) // block
    return ids[: n * block].view(n, block)


class ActivationBatches:
    """Endless batches of activations (B, d): region r is windows [r·W, (r+1)·W) (cycling
    over the text), computed when it is reached and served ``PASSES`` times in seeded
    orders. Its position is (region, pass, batch), so a resumed run recomputes its region
    and goes on with the batch the interrupted one would have given."""

    def __init__(self, lm: Any, hook: str, windows: Tensor, batch: int, seed: int) -> None:
        self.lm, self.hook, self.windows, self.batch, self.seed = lm, hook, windows, batch, seed
        self.region = self.pass_ = self.index = 0
        self._acts: Tensor | None = None
        self._order: Tensor | None = None

    def __iter__(self) -> ActivationBatches:
        return self

    def __next__(self) -> Tensor:
        if self._acts is None:
            n = len(self.windows)
            rows = torch.arange(self.region * REGION_WINDOWS, (self.region + 1) * REGION_WINDOWS)
            picked = self.windows[rows[: min(REGION_WINDOWS, n)] % n]
            self._acts = hook_activations(self.lm, self.hook, picked)
        if self._order is None:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.region * 97 + self.pass_)
            self._order = torch.randperm(len(self._acts), generator=g)
        take = self._order[self.index * self.batch : (self.index + 1) * self.batch]
        batch = self._acts[take]
        self.index += 1
        if (self.index + 1) * self.batch > len(self._acts):  # the next one would be short
            self.index, self._order = 0, None
            self.pass_ += 1
            if self.pass_ == PASSES:
                self.region, self.pass_, self._acts = self.region + 1, 0, None
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"region": self.region, "pass": self.pass_, "index": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.region, self.pass_, self.index = state["region"], state["pass"], state["index"]
        self._acts = self._order = None


@dataclass(kw_only=True)
class SAETask(Task):
    """A TopK SAE on a frozen model's activations."""

    name = "sae"
    tokenizer: Tokenizer
    lm: Any
    val_acts: Tensor
    val_windows: Tensor
    test_windows: Tensor

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        sae: Any = model
        figures = reconstruction_metrics(sae, self.val_acts)
        spliced = spliced_losses(self.lm, sae, self.val_windows[:SPLICE_WINDOWS])
        return {
            "val_explained_variance": figures["explained_variance"],
            "val_l0": figures["l0"],
            "dead_share": sae.dead_share(),
            "val_ce_increase": spliced["ce_increase"],
        }

    def test(self, model: nn.Module) -> dict[str, float]:
        """Explained variance, L0 and the features used on the test text's activations; the
        model's loss clean, spliced and zero-ablated; the dead share over training."""
        sae: Any = model
        held_out = self.test_windows[:TEST_WINDOWS]
        acts = hook_activations(self.lm, sae.config.hook_name, held_out)
        return {
            **{f"test_{k}": v for k, v in reconstruction_metrics(sae, acts).items()},
            **{f"test_{k}": v for k, v in spliced_losses(self.lm, sae, held_out).items()},
            "dead_share": sae.dead_share(),
            "test_tokens": len(acts),
        }

    def show(self, model: nn.Module) -> str:
        """The busiest features on the validation text, each with its top contexts; the
        firing frequencies drawn into features.png."""
        sae: Any = model
        with torch.no_grad():
            fired = (sae.encode(self.val_acts) > 0).float().mean(0)
        plot_density(fired, Path(str(self.config.out)) / "features.png")
        busiest = fired.argsort(descending=True)[:6].tolist()
        windows = self.val_windows[:VAL_WINDOWS]  # the windows val_acts were taken from
        found = top_contexts(self.lm, sae, windows, busiest, n=3, activations=self.val_acts)
        lines = [f"features firing on validation tokens: {int((fired > 0).sum())} of {len(fired)}"]
        for feature in busiest:
            lines.append(f"feature {feature} (fires on {float(fired[feature]):.1%} of tokens):")
            for c in found[feature]:
                row = self.val_windows[c.window].tolist()
                before = self.tokenizer.decode(row[max(0, c.position - 8) : c.position])
                token = self.tokenizer.decode(row[c.position : c.position + 1])
                lines.append(f"  {c.value:8.2f}  …{before!r} [{token!r}]")
        return "\n".join(lines)


def plot_density(fired: Tensor, path: Path) -> None:
    """A histogram of log10 of each feature's firing frequency (dead ones counted apart)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    alive = fired[fired > 0]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.hist(alive.log10().numpy(), bins=50, color="#4477aa")
    ax.set_xlabel("log10 of the share of validation tokens a feature fires on")
    ax.set_ylabel("features")
    ax.set_title(f"feature density ({int((fired == 0).sum())} of {len(fired)} never fired)")
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
