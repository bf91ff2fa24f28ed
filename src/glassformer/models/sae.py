"""Sparse autoencoders: an activation rewritten as a few of many learned features.

A sparse autoencoder (SAE) reads one hook point's activation x (d_in) and writes it as a
sparse code z over d_sae ≫ d_in features, from which it rebuilds x:

    pre = (x − b_dec) W_enc + b_enc          (d_sae,) each feature's evidence
    z   = TopK(pre), the k largest kept (ReLU'd), every other zero
    x̂   = z W_dec + b_dec                    the reconstruction

Each row of ``W_dec`` is one feature's direction in the activation space; a feature
"fires" where its z is above zero. ``architecture`` "topk" is Gao et al.'s (OpenAI, 2024),
which ``glassformer train sae`` trains; "standard" (a ReLU over every feature) and
"jumprelu" (a ReLU with a learned threshold per feature) are read from SAELens files. The
tensors and their names are SAELens's (``interop.saelens`` reads and writes its
``cfg.json`` + ``sae_weights.safetensors``); a glassformer SAE's checkpoint holds those two
files beside its own, and ``SparseAutoencoder.from_pretrained`` opens a SAELens directory.

Training keeps the decoder's rows at unit norm in effect (SAELens's
``rescale_acts_by_decoder_norm``): a feature's evidence is scaled by its row's norm before
the top k are chosen and its value divided by it before decoding, so a row's length does
not decide which features win. Saving folds the norms in (an equivalent SAE with unit rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor, nn

from glassformer.errors import shown
from glassformer.models.base import ConfigBase, PretrainedModel, is_integer

ARCHITECTURES = ("topk", "standard", "jumprelu")


@dataclass(frozen=True)
class SAEConfig(ConfigBase):
    """An SAE's shape and what it reads.

    Attributes:
        d_in: the activation's width.
        d_sae: the number of features.
        architecture: "topk" (trained here), "standard" (ReLU), "jumprelu".
        k: features kept per activation (TopK).
        apply_b_dec_to_input: subtract ``b_dec`` before encoding (SAELens's default).
        rescale_acts_by_decoder_norm: choose and scale features by the decoder rows'
            norms (training; folded away when saved).
        model_name: the model it reads (a run directory or a packaged name).
        hook_name: the hook point it reads (``blocks.15.hook_resid_post``).
        context_size: the windows of text it was trained on, in tokens.
        dataset_path: the corpus or file it was trained on.
        skip_first: the first position of each window left out of training (attention
            sinks carry norms many times the others').
    """

    d_in: int = 512
    d_sae: int = 4096
    architecture: str = "topk"
    k: int = 32
    apply_b_dec_to_input: bool = True
    rescale_acts_by_decoder_norm: bool = False
    model_name: str = ""
    hook_name: str = ""
    context_size: int = 128
    dataset_path: str = ""
    skip_first: bool = True

    @property
    def d_model(self) -> int:
        """The width it reads (what a model's d_model is to the noam schedule)."""
        return self.d_in

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(
                f"architecture must be one of {', '.join(ARCHITECTURES)}, "
                f"got {shown(self.architecture)}"
            )
        for name in ("d_in", "d_sae", "k", "context_size"):
            value = getattr(self, name)
            if not is_integer(value) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {shown(value)}")
        if self.architecture == "topk" and not 1 <= self.k <= self.d_sae:
            raise ValueError(f"k must be between 1 and d_sae ({self.d_sae}), got {self.k}")


class SAEOutput(NamedTuple):
    reconstruction: Tensor  # (..., d_in)
    features: Tensor  # (..., d_sae), mostly zeros
    pre: Tensor  # (..., d_sae), the evidence before the choice


class SparseAutoencoder(PretrainedModel):
    """A sparse autoencoder (see the module's docstring): ``sae(x).reconstruction``,
    ``sae.encode(x)`` (the features), ``sae.decode(z)``; ``sae.splice()`` is a hook that
    puts the reconstruction in place of the activation."""

    kind = "sae"
    config_class = SAEConfig
    since_fired: Tensor
    DEAD_AFTER: ClassVar[int] = 250_000  # tokens without firing: a feature counts as dead

    def __init__(self, config: SAEConfig) -> None:
        super().__init__()
        self.config = config
        d_in, d_sae = config.d_in, config.d_sae
        direction = nn.init.kaiming_uniform_(torch.empty(d_sae, d_in))
        direction = direction / direction.norm(dim=1, keepdim=True)
        self.W_dec = nn.Parameter(direction.clone())  # (d_sae, d_in): each feature's direction
        self.W_enc = nn.Parameter(direction.T.clone())  # (d_in, d_sae), the decoder's transpose
        self.b_enc = nn.Parameter(torch.zeros(d_sae))
        self.b_dec = nn.Parameter(torch.zeros(d_in))
        if config.architecture == "jumprelu":
            self.threshold = nn.Parameter(torch.zeros(d_sae))
        # tokens since each feature last fired, while training (AuxK and the dead share)
        self.register_buffer("since_fired", torch.zeros(d_sae, dtype=torch.long))

    def _norms(self) -> Tensor | None:
        return self.W_dec.norm(dim=1) if self.config.rescale_acts_by_decoder_norm else None

    def evidence(self, x: Tensor) -> Tensor:
        """Each feature's evidence ``pre`` for activations x (..., d_in): (..., d_sae)."""
        if x.size(-1) != self.config.d_in:
            raise ValueError(
                f"this SAE reads activations {self.config.d_in} wide"
                f"{' (' + self.config.hook_name + ')' if self.config.hook_name else ''}, "
                f"got {x.size(-1)}: an SAE of another model or hook point"
            )
        x = x.to(self.W_enc.dtype)
        if self.config.apply_b_dec_to_input:
            x = x - self.b_dec
        pre = x @ self.W_enc + self.b_enc
        norms = self._norms()
        return pre if norms is None else pre * norms

    def choose(self, pre: Tensor) -> Tensor:
        """The sparse code from the evidence: top k (ReLU'd), ReLU, or above threshold."""
        if self.config.architecture == "topk":
            values, index = pre.topk(self.config.k, dim=-1)
            return torch.zeros_like(pre).scatter(-1, index, values.relu())
        if self.config.architecture == "jumprelu":
            return pre * (pre > self.threshold)
        return pre.relu()

    def encode(self, x: Tensor) -> Tensor:
        """The features of activations x (..., d_in): (..., d_sae)."""
        return self.choose(self.evidence(x))

    def decode(self, z: Tensor) -> Tensor:
        """The activation rebuilt from features z (..., d_sae): (..., d_in)."""
        norms = self._norms()
        return (z if norms is None else z / norms) @ self.W_dec + self.b_dec

    def forward(self, x: Tensor) -> SAEOutput:
        pre = self.evidence(x)
        z = self.choose(pre)
        return SAEOutput(self.decode(z).to(x.dtype), z, pre)

    def splice(self, *, keep_error: bool = False) -> Any:
        """A hook function putting the reconstruction in place of the activation:
        ``model.run_with_hooks(ids, hooks=[(sae.config.hook_name, sae.splice())])``.
        ``keep_error``: add back what the SAE misses (the output is then the model's own;
        the features can be edited in between)."""

        def hook(value: Tensor, name: str) -> Tensor:
            rebuilt = self(value).reconstruction
            return rebuilt + (value - rebuilt).detach() if keep_error else rebuilt

        return hook

    # ---- training -----------------------------------------------------------------------

    def training_loss(self, x: Tensor, variance: float, aux_weight: float = 1 / 32) -> Tensor:
        """The summed loss of a batch of activations x (N, d_in): each one's squared error
        over ``variance`` (the activations' mean squared distance from their mean: the sum
        over N is then N × the fraction of variance unexplained), plus AuxK (Gao et al.):
        the dead features' top k_aux rebuilding what the live ones miss, so that they
        come back. Counts the tokens since each feature fired."""
        pre = self.evidence(x)
        z = self.choose(pre)
        rebuilt = self.decode(z)
        error = x - rebuilt
        loss = error.pow(2).sum() / variance
        with torch.no_grad():
            fired = (z > 0).any(0)
            self.since_fired += len(x)
            self.since_fired[fired] = 0
        dead = self.since_fired > self.DEAD_AFTER
        if aux_weight and dead.any():
            k_aux = min(int(dead.sum()), self.config.d_in // 2)
            values, index = pre.masked_fill(~dead, float("-inf")).topk(k_aux, dim=-1)
            codes = torch.zeros_like(pre).scatter(-1, index, values.relu())
            norms = self._norms()
            guess = (codes if norms is None else codes / norms) @ self.W_dec
            aux = (guess - error.detach()).pow(2).sum() / variance
            loss = loss + aux_weight * aux
        return loss

    def dead_share(self) -> float:
        """The share of features that have not fired for ``DEAD_AFTER`` training tokens."""
        return float((self.since_fired > self.DEAD_AFTER).float().mean())

    def folded(self) -> dict[str, Tensor]:
        """The weights as an equivalent SAE without ``rescale_acts_by_decoder_norm``: unit
        decoder rows, the norms moved into the encoder."""
        names = ["W_enc", "b_enc", "W_dec", "b_dec"]
        if self.config.architecture == "jumprelu":
            names.append("threshold")
        weights: dict[str, Tensor] = {
            name: getattr(self, name).detach().float().clone() for name in names
        }
        norms = self._norms()
        if norms is not None:
            norms = norms.detach().float()
            weights["W_enc"] *= norms
            weights["b_enc"] *= norms
            weights["W_dec"] /= norms[:, None]
        return weights
