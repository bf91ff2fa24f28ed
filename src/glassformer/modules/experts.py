"""A mixture of experts: the MLP sub-layer as many gated MLPs, a few of them chosen for
each token (Shazeer et al. 2017; Mixtral, OLMoE, Qwen2-MoE).

Shapes: B batch, T positions, D d_model, E experts, k chosen per token.

    logits  = router(x)                                  (B, T, E)
    p       = softmax(logits)                            over the E experts
    chosen  = the k largest p at each token              (renormalised to sum to 1, Mixtral's)
    out     = Σ over the chosen e of  p_e · expert_e(x)  (B, T, D)

Each expert runs on the tokens that chose it and on no others, as transformers computes it:
the work grows with k, not with E. A shared expert (Qwen2-MoE) runs on every token, its
output scaled by sigmoid(shared_gate(x)), and is added to the routed experts' sum.

Hook points (the router's and each expert's, as TransformerLens names them):

    hook_router_logits        (B, T, E)  the router's scores
    hook_router_weights       (B, T, E)  each expert's weight at each token: 0 where not
                                         chosen (the tokens an expert runs on are where its
                                         weight is not 0, so replacing these weights reroutes)
    experts.{e}.hook_out      (B, T, D)  expert e's output, 0 at the tokens that did not choose it
    shared_expert.hook_out    (B, T, D)  the shared expert's output, before its gate
    hook_shared_weight        (B, T, 1)  sigmoid(shared_gate(x))
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from glassformer.modules.feedforward import GATED_ACTIVATIONS
from glassformer.modules.hooks import HookPoint


class Expert(nn.Module):
    """One expert: a gated MLP, down_proj(act(gate_proj(x)) · up_proj(x)), without biases,
    run on the rows (tokens) it is given."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "swiglu") -> None:
        super().__init__()
        if activation not in GATED_ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(GATED_ACTIVATIONS)}, got {activation!r}"
            )
        if d_ff <= 0:
            raise ValueError(f"d_ff must be a positive integer, got {d_ff}")
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)
        self._act = GATED_ACTIVATIONS[activation]
        self.hook_out = HookPoint()  # (B, T, D), 0 where the expert did not run

    def forward(self, x: Tensor) -> Tensor:
        """(N, D) → (N, D): the rows it was chosen for."""
        return self.down_proj(self._act(self.gate_proj(x)) * self.up_proj(x))


class MixtureOfExperts(nn.Module):
    """A router choosing ``top_k`` of ``num_experts`` experts for each token.

    Args:
        d_model: D.
        d_ff: each expert's inner width.
        num_experts: E.
        top_k: k, the experts each token goes to.
        normalize: the k chosen weights are divided by their sum (Mixtral; OLMoE and Qwen's
            ``norm_topk_prob``), else they stay softmax probabilities over all E.
        shared_d_ff: the inner width of a shared expert that every token goes to, gated by
            sigmoid(``shared_gate``(x)) (Qwen2-MoE), or None.
        activation: the experts' gated activation ("swiglu").
    """

    def __init__(
        self,
        *,
        d_model: int,
        d_ff: int,
        num_experts: int,
        top_k: int,
        normalize: bool = True,
        shared_d_ff: int | None = None,
        activation: str = "swiglu",
    ) -> None:
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(f"top_k must be in 1..num_experts={num_experts}, got {top_k}")
        self.top_k, self.normalize = top_k, normalize
        self.router = nn.Linear(d_model, num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(d_model, d_ff, activation) for _ in range(num_experts))
        self.shared_expert = (
            None if shared_d_ff is None else Expert(d_model, shared_d_ff, activation)
        )
        self.shared_gate = None if shared_d_ff is None else nn.Linear(d_model, 1, bias=False)
        self.hook_router_logits = HookPoint()  # (B, T, E)
        self.hook_router_weights = HookPoint()  # (B, T, E), 0 where an expert is not chosen
        if shared_d_ff is not None:
            self.hook_shared_weight = HookPoint()  # (B, T, 1)

    @property
    def num_experts(self) -> int:
        return len(self.experts)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, D) → (B, T, D)."""
        weights = self.hook_router_weights(self.route(self.hook_router_logits(self.router(x))))
        out = self.routed(x, weights)
        if self.shared_expert is not None and self.shared_gate is not None:
            gate = self.hook_shared_weight(torch.sigmoid(self.shared_gate(x)))  # (B, T, 1)
            out = out + gate * self.shared_expert.hook_out(self.shared_expert(x))
        return out

    def route(self, logits: Tensor) -> Tensor:
        """The router's ``logits`` (B, T, E) → each expert's weight (B, T, E): the softmax
        (in float32) at the ``top_k`` largest, renormalised where ``normalize``, 0 elsewhere."""
        probs = logits.float().softmax(dim=-1)
        top, chosen = probs.topk(self.top_k, dim=-1)  # (B, T, k)
        if self.normalize:
            top = top / top.sum(dim=-1, keepdim=True)
        return torch.zeros_like(probs).scatter(-1, chosen, top)

    def routed(self, x: Tensor, weights: Tensor) -> Tensor:
        """Σ_e weights_e · expert_e(x), each expert run on the tokens whose weight for it is
        not 0: x (B, T, D), weights (B, T, E) → (B, T, D)."""
        B, T, D = x.shape
        rows, w = x.reshape(-1, D), weights.reshape(-1, self.num_experts)
        out = torch.zeros_like(rows)
        for e, module in enumerate(self.experts):
            expert = cast(Expert, module)
            tokens = w[:, e].nonzero().squeeze(1)  # the rows that chose expert e
            hooked = bool(expert.hook_out.fns)
            if tokens.numel() == 0 and not hooked:
                continue
            y = expert(rows[tokens])  # (N_e, D)
            if hooked:  # its output at every token, 0 where it did not run
                every = rows.new_zeros(B * T, D).index_copy(0, tokens, y.to(rows.dtype))
                y = expert.hook_out(every.view(B, T, D)).reshape(B * T, D)[tokens]
            out.index_add_(0, tokens, (y * w[tokens, e, None]).to(out.dtype))
        return out.view(B, T, D)

    def extra_repr(self) -> str:
        shared = ", shared expert" if self.shared_expert is not None else ""
        return f"experts={self.num_experts}, top_k={self.top_k}, normalize={self.normalize}{shared}"
