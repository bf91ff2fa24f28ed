"""Transcoders: TopK transcoders learn to predict every chosen block's MLP output from its
input, on a frozen model, all layers from the same forward passes.

The model (``--model``: a run directory, a packaged name such as SmolLM2-135M-Instruct, or
a Hub id) stays frozen. It reads windows of the text (``--block-size`` tokens); each
chosen block's MLP input and output (``--layers``, every block by default) are the data,
one row per token but the first of each window. They come a region of windows at a time
(``REGION_WINDOWS``), each region served shuffled ``PASSES`` times: the model's forward
costs more than a step of the transcoders. Evaluation is each layer's normalised MSE and
L0 on validation activations, the dead share, and the model's loss with every MLP replaced
at once; the held-out report adds the same on the test text.

A step costs one dense product per layer (every feature's evidence, to choose the top k)
and sparse work for the rest: the gradient reaches only the chosen features' encoder and
decoder rows (``_Picked``, ``F.embedding_bag``), which the loss alone would make a dense
product three times over.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from glassformer.data.activations import ActivationStore
from glassformer.data.images import ImageProcessor
from glassformer.data.tokenizers import Tokenizer
from glassformer.inspect.transcoders import (
    check_transcodable,
    mlp_activations,
    spliced_losses,
    transcoder_metrics,
)
from glassformer.kernels.fidelity import fingerprint
from glassformer.models.transcoder import TranscoderConfig, Transcoders
from glassformer.training.config import RunConfig, filled
from glassformer.training.distributed import Distributed
from glassformer.training.tasks.common import Task, load_splits, tokenizer_files
from glassformer.training.tasks.sae import windows as cut_windows

REGION_WINDOWS = 64  # windows whose activations are computed together
PASSES = 2  # shuffled passes over each region
VAL_WINDOWS, SPLICE_WINDOWS, TEST_WINDOWS = 16, 8, 24
FIT_WINDOWS = 32  # the last training windows, for the skip term's starting fit
AUX_WEIGHT = 1 / 32


def parse_layers(text: str | None, blocks: int) -> tuple[int, ...]:
    """``--layers``: "all" (or None), "a-b", or "a,b,c" → block indices, each checked."""
    if text in (None, "all"):
        return tuple(range(blocks))
    try:
        layers: set[int] = set()
        for part in str(text).split(","):
            a, _, b = part.strip().partition("-")
            layers.update(range(int(a), int(b or a) + 1))
    except ValueError:
        raise ValueError(f'--layers takes "all", "a-b" or "a,b,c", got {text!r}') from None
    if not layers or min(layers) < 0 or max(layers) >= blocks:
        raise ValueError(f"--layers {text!r}: the model has blocks 0 … {blocks - 1}")
    return tuple(sorted(layers))


def build(
    config: RunConfig,
    *,
    tokenizer: Tokenizer | ImageProcessor | None = None,
    labels: list[str] | None = None,
    world: Distributed,
) -> TranscoderTask:
    """The frozen model, its MLP activations as batches, and TopK transcoders of its width
    (``--features`` per layer, ``--k`` active)."""
    from glassformer.inference import load_run

    if world.enabled:
        raise ValueError("train transcoder runs in one process (its data is one model's)")
    if world.device.type != "cpu":
        raise ValueError("train transcoder runs on the CPU for now: give --device cpu")
    model, tok = load_run(str(config.model))
    model.eval().requires_grad_(False)
    check_transcodable(model)  # a decoder-only language model, pre-norm
    layers = parse_layers(config.layers, len(model.blocks))
    d_model = int(model.config.d_model)
    block = config.block_size
    tc_config = TranscoderConfig(
        d_model=d_model, d_transcoder=config.features or 8 * d_model, layers=layers,
        k=filled(config.k), skip=config.skip, cross_layer=config.cross_layer,
        rescale_acts_by_decoder_norm=True,
        model_name=str(config.model), context_size=block,
        dataset_path=config.corpus or str(config.data))  # fmt: skip
    check_transcodable(model, tc_config)
    train_text, val_text, test_text, description = load_splits(config)
    train, val = cut_windows(tok, train_text, block), cut_windows(tok, val_text, block)
    if len(train) < 2 or len(val) < 1:
        raise ValueError(f"need at least 3 windows of {block} tokens; give more text")
    val_x, val_y = mlp_activations(model, tc_config, val[:VAL_WINDOWS])
    tc = Transcoders(tc_config)
    mean = val_y.mean(1)  # (n, D)
    with torch.no_grad():
        tc.b_dec.copy_(mean)
        if config.skip:  # the best linear map to start from: features learn what it misses
            fit_x, fit_y = mlp_activations(model, tc_config, train[-FIT_WINDOWS:])
            tc.W_skip.copy_(ridge(fit_x, fit_y).mT)
            tc.b_dec.copy_(fit_y.mean(1) - torch.einsum("nd,ned->ne", fit_x.mean(1), tc.W_skip))
    variance = (val_y - mean[:, None]).pow(2).sum(-1).mean(1)  # (n,): the loss's unit
    return TranscoderTask(
        config=config,
        tokenizer=tok,
        model=tc,
        batches=_batches(config, model, tc_config, train),
        loss_fn=partial(_loss, variance=variance),
        extra_files=tokenizer_files(tok),
        description=f"{description}; the MLPs of blocks {_span(layers)} of {config.model}",
        lm=model,
        val_x=val_x,
        val_y=val_y,
        val_windows=val,
        test_windows=cut_windows(tok, test_text, block) if test_text else val,
    )


def _batches(config: RunConfig, lm: Any, tc_config: TranscoderConfig, train: Tensor) -> MLPBatches:
    """The training batches, streamed, or from (and into) the activation store ``--store``."""
    batches = MLPBatches(lm, tc_config, train, filled(config.batch_size), config.seed)
    if config.store:
        about = {"model": str(config.model), "layers": list(tc_config.layers),
                 "input": tc_config.input_hook, "output": tc_config.output_hook,
                 "text": config.corpus or str(config.data), "windows": len(train),
                 "block": tc_config.context_size,
                 "digest": fingerprint(lm, (train,))}  # fmt: skip
        batches.store = ActivationStore.open(config.store, about, batches.shard_shape(),
                                             batches.regions)  # fmt: skip
        shard = batches.shard_shape()
        print(f"activation store {config.store}: {batches.regions} shards of "
              f"{4 * shard[1] * shard[2] * shard[3] * 2 / 1e6:.0f} MB, "
              f"{batches.store.written()} written")  # fmt: skip
    return batches


def ridge(x: Tensor, y: Tensor, strength: float = 1e-3) -> Tensor:
    """Per layer, the W minimising ‖(y − ȳ) − (x − x̄) W‖² + λ‖W‖² for x, y (n, N, D); λ is
    ``strength`` × the mean eigenvalue of the inputs' scatter (a light hold on W)."""
    xc, yc = x - x.mean(1, keepdim=True), y - y.mean(1, keepdim=True)
    scatter = xc.mT @ xc  # (n, D, D)
    lam = strength * scatter.diagonal(dim1=1, dim2=2).mean(1)
    eye = torch.eye(x.size(-1))
    return torch.linalg.solve(scatter + lam[:, None, None] * eye, xc.mT @ yc)


def _span(layers: tuple[int, ...]) -> str:
    if layers == tuple(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}–{layers[-1]}"
    return ", ".join(map(str, layers))


def _loss(tc: Any, batch: Tensor, variance: Tensor) -> tuple[Tensor, int]:
    """The summed loss of a batch (2, n, B, D) of MLP inputs and outputs and its tokens."""
    return sparse_loss(tc, batch[0], batch[1], variance.to(batch.device)), batch.size(2)


class _Picked(torch.autograd.Function):
    """The evidence of the chosen features, given already computed (``values``), whose
    gradient reaches only their rows of W_enc and b_enc: a sparse product, not dense."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor, b: Tensor, index: Tensor,
                values: Tensor) -> Tensor:  # fmt: skip
        ctx.save_for_backward(x, index)
        ctx.features = w.size(0)
        return values.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
        x, index = ctx.saved_tensors
        rows = torch.arange(len(index), device=grad.device).repeat_interleave(index.size(1))
        where = torch.stack([index.flatten(), rows])  # (feature, token) of each grad
        spread = torch.sparse_coo_tensor(where, grad.flatten(), (ctx.features, len(x)),
                                         check_invariants=False)  # fmt: skip
        grad_w = torch.sparse.mm(spread, x)  # (f, D): Σ over tokens of grad × x, chosen rows
        grad_b = grad.new_zeros(ctx.features).index_add_(0, index.flatten(), grad.flatten())
        return None, grad_w, grad_b, None, None


def sparse_loss(tc: Any, x: Tensor, y: Tensor, variance: Tensor) -> Tensor:
    """What ``Transcoders``'s forward computes for TopK, as a loss: each layer's squared
    error over its ``variance``, summed over tokens and layers, plus AuxK for dead features
    (per-layer sets). Counts the tokens since each feature fired."""
    config = tc.config
    n, k = config.n_layers, config.k
    norms = tc.decoder_norms().detach()  # (n, f): the choice sees unit decoder rows
    with torch.no_grad():
        # (n, B, f), every feature's evidence: the one dense product (bf16 under autocast),
        # the rest in x's precision
        raw = torch.baddbmm(tc.b_enc[:, None], x, tc.W_enc.mT).to(x.dtype)
        index = (raw * norms[:, None]).topk(k, dim=-1).indices  # (n, B, k)
    predicted = tc.b_dec[:, None].expand(n, x.size(1), -1)
    # one view per layer by unbind: indexing the stacked parameters layer by layer would
    # give each layer's gradient the whole stack's size, n times over
    w_enc, b_enc = tc.W_enc.unbind(0), tc.b_enc.unbind(0)
    decoders = list(tc.W_dec) if config.cross_layer else [w[:, None] for w in tc.W_dec.unbind(0)]
    writes = []
    for i in range(n):
        picked = _Picked.apply(x[i], w_enc[i], b_enc[i], index[i], raw[i].gather(1, index[i]))
        values = picked.relu()  # z / norm: what the decoder rows are scaled by
        writes.append(F.embedding_bag(index[i], decoders[i].flatten(1), per_sample_weights=values,
                                      mode="sum").view(x.size(1), -1, config.d_model))  # fmt: skip
    if config.cross_layer:
        parts = [torch.stack([writes[i][:, j - i] for i in range(j + 1)]).sum(0)
                 for j in range(n)]  # fmt: skip
        predicted = predicted + torch.stack(parts)
    else:
        predicted = predicted + torch.stack([w[:, 0] for w in writes])
    if config.skip:
        predicted = predicted + torch.bmm(x, tc.W_skip.mT)
    error = y - predicted
    loss = (error.pow(2).sum((1, 2)) / variance).sum()
    with torch.no_grad():
        fired = torch.zeros_like(tc.since_fired, dtype=torch.bool)
        fired.scatter_(1, index.flatten(1), True)
        tc.since_fired += x.size(1)
        tc.since_fired[fired] = 0
    dead = tc.since_fired > tc.DEAD_AFTER
    if AUX_WEIGHT and dead.any() and not config.cross_layer:
        own = (w_enc, b_enc, [d[:, 0] for d in decoders])
        loss = loss + AUX_WEIGHT * _aux_loss(own, x, raw, norms, dead, error.detach(), variance)
    return loss


def _aux_loss(parts: tuple[Any, Any, Any], x: Tensor, raw: Tensor, norms: Tensor, dead: Tensor,
              error: Tensor, variance: Tensor) -> Tensor:  # fmt: skip
    """AuxK (Gao et al.): the dead features' top k_aux rebuilding what the live ones miss;
    ``parts``: each layer's W_enc, b_enc and W_dec."""
    w_enc, b_enc, w_dec = parts
    k_aux = min(int(dead.sum(1).max()), x.size(-1) // 2)
    with torch.no_grad():
        score = (raw * norms[:, None]).masked_fill(~dead[:, None], float("-inf"))
        index = score.topk(k_aux, dim=-1).indices
    total = raw.new_zeros(())
    for i in range(len(raw)):
        if not dead[i].any():
            continue
        picked = _Picked.apply(x[i], w_enc[i], b_enc[i], index[i], raw[i].gather(1, index[i]))
        values = picked.relu() * dead[i][index[i]]  # live ones among the top: no part
        guess = F.embedding_bag(index[i], w_dec[i], per_sample_weights=values, mode="sum")
        total = total + (guess - error[i]).pow(2).sum() / variance[i]
    return total


class MLPBatches:
    """Endless batches (2, n, B, D) of MLP inputs and outputs. The text's windows fall in
    R = ⌈N / W⌉ regions of W (the last one topped up from the start); the r-th region
    reached is region r mod R, its activations computed (or read from ``store``) when
    reached and served ``PASSES`` times in orders seeded by r, so every epoch is shuffled
    anew. Its position is (region, pass, batch): a resumed run recomputes (or reads) its
    region and goes on with the batch the interrupted one would have given."""

    def __init__(self, lm: Any, config: TranscoderConfig, windows: Tensor, batch: int,
                 seed: int, store: ActivationStore | None = None) -> None:  # fmt: skip
        self.lm, self.config, self.windows, self.batch, self.seed = lm, config, windows, batch, seed
        self.width = min(REGION_WINDOWS, len(windows))
        self.regions = -(-len(windows) // self.width)
        self.store = store
        self.region = self.pass_ = self.index = 0
        self._acts: Tensor | None = None
        self._order: Tensor | None = None

    def compute(self, place: int) -> Tensor:
        """Region ``place``'s activations, (2, n, W·(T − 1), D)."""
        rows = torch.arange(place * self.width, (place + 1) * self.width) % len(self.windows)
        return torch.stack(mlp_activations(self.lm, self.config, self.windows[rows]))

    def shard_shape(self) -> tuple[int, ...]:
        n, d = self.config.n_layers, self.config.d_model
        return (2, n, self.width * (self.windows.size(1) - 1), d)

    def __iter__(self) -> MLPBatches:
        return self

    def __next__(self) -> Tensor:
        if self._acts is None:
            place = self.region % self.regions
            if self.store is None:
                self._acts = self.compute(place)
            else:
                self._acts = self.store.region(place, self.compute)
        if self._order is None:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.region * 97 + self.pass_)
            self._order = torch.randperm(self._acts.size(2), generator=g)
        take = self._order[self.index * self.batch : (self.index + 1) * self.batch]
        batch = self._acts[:, :, take]
        self.index += 1
        if (self.index + 1) * self.batch > self._acts.size(2):  # the next one would be short
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
class TranscoderTask(Task):
    """TopK transcoders on a frozen model's MLPs."""

    name = "transcoder"
    tokenizer: Tokenizer
    lm: Any
    val_x: Tensor
    val_y: Tensor
    val_windows: Tensor
    test_windows: Tensor

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        tc: Any = model
        figures = transcoder_metrics(tc, self.val_x, self.val_y)
        spliced = spliced_losses(self.lm, tc, self.val_windows[:SPLICE_WINDOWS])
        return {
            "val_nmse": sum(figures["nmse"]) / len(figures["nmse"]),
            "val_nmse_worst": max(figures["nmse"]),
            "val_l0": sum(figures["l0"]) / len(figures["l0"]),
            "dead_share": tc.dead_share(),
            "val_ce_increase": spliced["ce_increase"],
        }

    def test(self, model: nn.Module) -> dict[str, Any]:
        """Per layer normalised MSE and L0 on the test text's activations; the model's loss
        clean and with every MLP replaced; the dead share over training."""
        tc: Any = model
        held_out = self.test_windows[:TEST_WINDOWS]
        x, y = mlp_activations(self.lm, tc.config, held_out)
        figures = transcoder_metrics(tc, x, y)
        return {
            "test_nmse": sum(figures["nmse"]) / len(figures["nmse"]),
            "test_l0": sum(figures["l0"]) / len(figures["l0"]),
            **{f"test_{k}": v for k, v in spliced_losses(self.lm, tc, held_out).items()},
            "test_nmse_per_layer": [round(v, 4) for v in figures["nmse"]],
            "test_l0_per_layer": [round(v, 1) for v in figures["l0"]],
            "dead_share": tc.dead_share(),
            "test_tokens": x.size(1),
        }

    def show(self, model: nn.Module) -> str:
        """Each layer's normalised MSE and L0 on the validation activations."""
        tc: Any = model
        figures = transcoder_metrics(tc, self.val_x, self.val_y)
        lines = ["layer  normalised MSE  L0  features used"]
        for i, layer in enumerate(tc.config.layers):
            lines.append(f"{layer:5d}  {figures['nmse'][i]:14.3f}  {figures['l0'][i]:3.0f}"
                         f"  {figures['features_used'][i]:.1%}")  # fmt: skip
        return "\n".join(lines)
