"""Transcoders: each block's MLP rewritten as a few of many learned features.

A sparse autoencoder rebuilds the activation it reads. A transcoder reads a block's MLP
input and predicts the MLP's *output* (Dunefsky et al., 2024), so the MLP, the part of a
model that is hardest to read, can be replaced by features that each read one direction
and write another:

    pre_l = W_enc[l] x_l + b_enc[l]        (d_transcoder,) layer l's features' evidence
    z_l   = act(pre_l)                     TopK, ReLU, or JumpReLU: mostly zeros
    ŷ_l   = z_l W_dec[l] + b_dec[l]        (d_model,) the MLP output predicted

``Transcoders`` holds one transcoder for each of ``layers`` (a per-layer transcoder set),
all trained together from the same forward passes. Two variants:

- **skip** (Paulo et al., 2025): ŷ_l gains a linear term x_l W_skipᵀ, so the features only
  need to carry what a linear map cannot.
- **cross-layer** (Ameisen et al., 2025): a feature read at layer l writes to the MLP
  output of l and of *every later* layer: ŷ_j = Σ_{l ≤ j} z_l W_dec[l][:, j − l] + b_dec[j].
  One feature then stands for a computation that several MLPs share.

The shapes are circuit-tracer's: ``W_enc`` (n, d_transcoder, d_model), a row per feature
(what it reads); ``W_dec`` (n, d_transcoder, d_model), or for a cross-layer set
``W_dec.{l}`` (d_transcoder, n − l, d_model), circuit-tracer's layout; ``W_skip`` (n,
d_model, d_model) as SAELens's (d_out, d_in). Activations travel layer-major: (n, N,
d_model), every layer's MLP input (or output) for the same N tokens.

Training keeps the decoder rows at unit norm in effect, as the SAE does
(``rescale_acts_by_decoder_norm``, kept in glassformer's checkpoint); ``unfolded()`` is the
equivalent set with unit rows, which the graph, interventions and other formats use.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
from torch import Tensor, nn

from glassformer.errors import shown
from glassformer.models.base import ConfigBase, PretrainedModel, is_integer

ARCHITECTURES = ("topk", "relu", "jumprelu")


@dataclass(frozen=True)
class TranscoderConfig(ConfigBase):
    """A set of transcoders: their shape and what they read.

    Attributes:
        d_model: the model's width (each MLP's input and output).
        d_transcoder: features per layer.
        layers: the blocks whose MLPs they replace (every block, for a graph).
        architecture: "topk" (trained here), "relu" or "jumprelu" (read from files).
        k: features kept per token and layer (TopK).
        cross_layer: each feature writes to its own and every later layer's MLP output.
        skip: a linear skip term x W_skipᵀ beside the features.
        input_hook: what each reads, under ``blocks.{i}.`` (the MLP's input).
        output_hook: what each predicts, under ``blocks.{i}.`` (the MLP's output).
        rescale_acts_by_decoder_norm: choose and scale features by their decoder norms
            (training; folded away when saved).
        model_name: the model they read (a run directory, packaged name or Hub id).
        context_size: the windows of text trained on, in tokens.
        dataset_path: the corpus or file trained on.
        skip_first: the first position of each window left out (attention sinks).
    """

    d_model: int = 512
    d_transcoder: int = 4096
    layers: tuple[int, ...] = (0,)
    architecture: str = "topk"
    k: int = 32
    cross_layer: bool = False
    skip: bool = False
    input_hook: str = "ln2.hook_normalized"
    output_hook: str = "hook_mlp_out"
    rescale_acts_by_decoder_norm: bool = False
    model_name: str = ""
    context_size: int = 128
    dataset_path: str = ""
    skip_first: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))  # JSON gives a list
        if self.architecture not in ARCHITECTURES:
            raise ValueError(
                f"architecture must be one of {', '.join(ARCHITECTURES)}, "
                f"got {shown(self.architecture)}"
            )
        for name in ("d_model", "d_transcoder", "k", "context_size"):
            value = getattr(self, name)
            if not is_integer(value) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {shown(value)}")
        layers = self.layers
        if (
            not layers
            or not all(is_integer(i) and i >= 0 for i in layers)
            or (list(layers) != sorted(set(layers)))
        ):
            raise ValueError(
                f"layers must be block indices in increasing order, got {shown(layers)}"
            )
        if self.architecture == "topk" and not 1 <= self.k <= self.d_transcoder:
            raise ValueError(f"k must be between 1 and d_transcoder ({self.d_transcoder}), "
                             f"got {self.k}")  # fmt: skip

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def hook(self, i: int, which: str = "input") -> str:
        """The hook point transcoder i reads ("input") or predicts ("output")."""
        leaf = self.input_hook if which == "input" else self.output_hook
        return f"blocks.{self.layers[i]}.{leaf}"


class TranscoderOutput(NamedTuple):
    outputs: Tensor  # (n, N, d_model): each layer's MLP output predicted
    features: Tensor  # (n, N, d_transcoder), mostly zeros
    pre: Tensor  # (n, N, d_transcoder), the evidence before the choice


class Transcoders(PretrainedModel):
    """A set of transcoders (see the module's docstring): ``tc(x).outputs``,
    ``tc.encode(x)`` (the features), ``tc.decode(z, x)``, all layer-major (n, N, ·)."""

    kind = "transcoder"
    config_class = TranscoderConfig
    since_fired: Tensor
    DEAD_AFTER = 250_000  # tokens without firing: a feature counts as dead

    def __init__(self, config: TranscoderConfig) -> None:
        super().__init__()
        self.config = config
        n, d, f = config.n_layers, config.d_model, config.d_transcoder
        direction = nn.init.kaiming_uniform_(torch.empty(n, f, d))
        direction = direction / direction.norm(dim=-1, keepdim=True)
        self.W_enc = nn.Parameter(direction.clone())  # (n, f, d): what each feature reads
        self.b_enc = nn.Parameter(torch.zeros(n, f))
        self.W_dec: nn.Parameter | nn.ParameterList
        if config.cross_layer:  # layer l's features write to layers l..n-1
            self.W_dec = nn.ParameterList(
                nn.Parameter(direction[i, :, None].expand(f, n - i, d) / (n - i) ** 0.5 + 0)
                for i in range(n)
            )
        else:
            self.W_dec = nn.Parameter(direction.clone())  # (n, f, d)
        self.b_dec = nn.Parameter(torch.zeros(n, d))
        if config.architecture == "jumprelu":
            self.threshold = nn.Parameter(torch.zeros(n, f))
        if config.skip:
            self.W_skip = nn.Parameter(torch.zeros(n, d, d))  # (d_out, d_in) per layer
        self.register_buffer("since_fired", torch.zeros(n, f, dtype=torch.long))

    def decoder(self, i: int) -> Tensor:
        """Layer i's features' decoder rows, (d_transcoder, outputs, d_model): one output
        (its own layer) per feature, or n − i for a cross-layer set."""
        if isinstance(self.W_dec, nn.ParameterList):
            return self.W_dec[i]
        return self.W_dec[i][:, None]

    def decoder_norms(self) -> Tensor:
        """Each feature's decoder norm (over every layer it writes to), (n, f)."""
        return torch.stack([self.decoder(i).flatten(1).norm(dim=1) for i in range(len(self.b_enc))])

    def _norms(self) -> Tensor | None:
        """The decoder norms where features are scaled by them (training), else None."""
        return self.decoder_norms() if self.config.rescale_acts_by_decoder_norm else None

    def _check(self, x: Tensor) -> None:
        n, d = self.config.n_layers, self.config.d_model
        if x.dim() != 3 or x.size(0) != n or x.size(-1) != d:
            raise ValueError(
                f"these transcoders read activations (layers {n}, tokens, width {d}) "
                f"of {self.config.input_hook} at blocks {list(self.config.layers)}, "
                f"got {tuple(x.shape)}"
            )

    def evidence(self, x: Tensor) -> Tensor:
        """Every feature's evidence for MLP inputs x (n, N, d_model): (n, N, d_transcoder)."""
        self._check(x)
        pre = torch.baddbmm(self.b_enc[:, None], x.to(self.W_enc.dtype), self.W_enc.mT)
        norms = self._norms()
        return pre if norms is None else pre * norms[:, None]

    def choose(self, pre: Tensor, i: int | None = None) -> Tensor:
        """The sparse code from the evidence: top k (ReLU'd), ReLU, or above threshold;
        of every layer (n, N, f), or of layer i alone (..., f)."""
        if self.config.architecture == "topk":
            values, index = pre.topk(self.config.k, dim=-1)
            return torch.zeros_like(pre).scatter(-1, index, values.relu())
        if self.config.architecture == "jumprelu":  # z·H(z − θ); ReLU'd as SAELens (θ < 0)
            threshold = self.threshold[:, None] if i is None else self.threshold[i]
            return pre.relu() * (pre > threshold)
        return pre.relu()

    def encode_layer(self, x: Tensor, i: int) -> Tensor:
        """Layer i's features of its MLP input x (..., d_model): (..., d_transcoder)."""
        pre = x.to(self.W_enc.dtype) @ self.W_enc[i].T + self.b_enc[i]
        norms = self._norms()
        return self.choose(pre if norms is None else pre * norms[i], i)

    def writes(self, z: Tensor, i: int) -> Tensor:
        """What layer i's features z (..., d_transcoder) add to the MLP outputs of layer i
        and (cross-layer) every later one: (outputs, ..., d_model), without the biases."""
        norms = self._norms()
        z = z if norms is None else z / norms[i]
        return torch.einsum("...f,fod->o...d", z, self.decoder(i))

    def encode(self, x: Tensor) -> Tensor:
        """The features of MLP inputs x (n, N, d_model): (n, N, d_transcoder)."""
        return self.choose(self.evidence(x))

    def decode(self, z: Tensor, x: Tensor | None = None) -> Tensor:
        """The MLP outputs predicted from features z (n, N, d_transcoder), and from the
        inputs x (n, N, d_model) where there is a skip term: (n, N, d_model)."""
        norms = self._norms()
        z = z if norms is None else z / norms[:, None]
        if isinstance(self.W_dec, nn.ParameterList):
            out = self.b_dec[:, None].expand(len(z), z.size(1), -1).clone()
            for i in range(len(z)):  # layer i writes to layers i, i+1, ...
                out[i:] += torch.einsum("nf,fod->ond", z[i], self.W_dec[i])
        else:
            out = torch.baddbmm(self.b_dec[:, None], z, self.W_dec)
        if self.config.skip:
            if x is None:
                raise ValueError("skip transcoders decode from their inputs too: give x")
            out = out + torch.bmm(x.to(out.dtype), self.W_skip.transpose(1, 2))
        return out

    def forward(self, x: Tensor) -> TranscoderOutput:
        pre = self.evidence(x)
        z = self.choose(pre)
        return TranscoderOutput(self.decode(z, x).to(x.dtype), z, pre)

    # ---- training (the loss: training.tasks.transcoder) ------------------------------------

    def dead_share(self) -> float:
        """The share of features that have not fired for ``DEAD_AFTER`` training tokens."""
        return float((self.since_fired > self.DEAD_AFTER).float().mean())

    def folded(self) -> dict[str, Tensor]:
        """The weights as an equivalent set without ``rescale_acts_by_decoder_norm``: unit
        decoder rows (over every layer a feature writes to), the norms in the encoder."""
        weights: dict[str, Tensor] = {
            name: value.detach().float().clone() for name, value in self.state_dict().items()
            if name != "since_fired"
        }  # fmt: skip
        norms = self._norms()
        if norms is not None:
            norms = norms.detach().float()
            weights["W_enc"] *= norms[..., None]
            weights["b_enc"] *= norms
            for i in range(len(norms)):
                key = f"W_dec.{i}" if self.config.cross_layer else "W_dec"
                if self.config.cross_layer:
                    weights[key] /= norms[i][:, None, None]
                else:
                    weights[key][i] /= norms[i][:, None]
        return weights

    def unfolded(self) -> Transcoders:
        """An equivalent set without decoder-norm scaling (what files hold)."""
        plain = Transcoders(replace(self.config, rescale_acts_by_decoder_norm=False))
        plain.load_state_dict({**self.folded(), "since_fired": self.since_fired.clone()})
        return plain.eval()
