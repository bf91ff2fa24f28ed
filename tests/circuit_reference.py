"""GPT-2's forward pass written out by hand, in float64, from a glassformer GPT's weights,
with each reader reading its own copy of the residual stream: the stream as the sum of
the writes before it, where any edge may carry another run's write instead, and any
reader may be nudged (for its gradient). Nothing here uses glassformer's hook points, so
the edge scores and circuit runs of ``glassformer.inspect`` are checked against numbers
computed another way."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


class HandGPT:
    """A glassformer ``GPT`` (learned positions, LayerNorm, GELU MLP, tied unembedding)."""

    def __init__(self, model) -> None:
        self.p = {name: t.detach().double() for name, t in model.state_dict().items()}
        self.layers = model.config.num_layers
        self.heads = model.config.num_heads
        self.d = model.config.d_model
        self.dh = self.d // self.heads

    def readers(self) -> list[str]:
        out = []
        for i in range(self.layers):
            out += [f"L{i}.H{h}.{x}" for x in "qkv" for h in range(self.heads)] + [f"L{i}.mlp"]
        return out + ["logits"]

    def embed(self, ids: Tensor) -> Tensor:
        return self.p["embed.weight"][ids[0]] + self.p["pos_embed.weight"][: ids.size(1)]

    def run(
        self,
        ids: Tensor,
        *,
        embed: Tensor | None = None,
        outside: set[tuple[str, str]] = frozenset(),
        other: dict[str, Tensor] | None = None,
        nudges: dict[str, Tensor] | None = None,
        held: dict[str, Tensor] | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """(logits (T, V), every writer's output (T, D)). The edges in ``outside`` carry
        ``other``'s write of their writer; ``nudges[reader]`` is added to its input; the
        writers in ``held`` write the value given there."""
        held = held or {}
        p, T = self.p, ids.size(1)
        writes = {"embed": self.embed(ids) if embed is None else embed}
        writes["embed"] = held.get("embed", writes["embed"])
        biases = torch.zeros(T, self.d, dtype=torch.float64)  # the attention outputs' biases

        def read(reader: str) -> Tensor:
            total = biases.clone()
            for writer, value in writes.items():
                total = total + (other[writer] if (writer, reader) in outside else value)
            return total + nudges[reader] if nudges else total

        def norm(x: Tensor, name: str) -> Tensor:
            return F.layer_norm(x, (self.d,), p[f"{name}.weight"], p[f"{name}.bias"], 1e-5)

        causal = torch.ones(T, T, dtype=torch.bool).tril()
        for i in range(self.layers):
            W, b = p[f"blocks.{i}.attn.qkv_proj.weight"], p[f"blocks.{i}.attn.qkv_proj.bias"]
            out_w = p[f"blocks.{i}.attn.out_proj.weight"]
            made = {}
            for h in range(self.heads):
                for j, x in enumerate("qkv"):
                    rows = slice(j * self.d + h * self.dh, j * self.d + (h + 1) * self.dh)
                    inp = norm(read(f"L{i}.H{h}.{x}"), f"blocks.{i}.ln1")
                    made[x, h] = inp @ W[rows].T + b[rows]
            for h in range(self.heads):
                scores = made["q", h] @ made["k", h].T / math.sqrt(self.dh)
                pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
                z = pattern @ made["v", h]
                writes[f"L{i}.H{h}"] = z @ out_w[:, h * self.dh : (h + 1) * self.dh].T
                writes[f"L{i}.H{h}"] = held.get(f"L{i}.H{h}", writes[f"L{i}.H{h}"])
            biases = biases + p[f"blocks.{i}.attn.out_proj.bias"]
            x = norm(read(f"L{i}.mlp"), f"blocks.{i}.ln2")
            hidden = F.gelu(x @ p[f"blocks.{i}.mlp.linear1.weight"].T
                            + p[f"blocks.{i}.mlp.linear1.bias"])  # fmt: skip
            writes[f"L{i}.mlp"] = (hidden @ p[f"blocks.{i}.mlp.linear2.weight"].T
                                   + p[f"blocks.{i}.mlp.linear2.bias"])  # fmt: skip
            writes[f"L{i}.mlp"] = held.get(f"L{i}.mlp", writes[f"L{i}.mlp"])
        logits = norm(read("logits"), "ln_final") @ p["embed.weight"].T
        return logits, writes

    def groups(self) -> list[list[str]]:
        """The writers that move together under EAP-IG over activations: the embeddings,
        each block's heads, each block's MLP."""
        out = [["embed"]]
        for i in range(self.layers):
            out += [[f"L{i}.H{h}" for h in range(self.heads)], [f"L{i}.mlp"]]
        return out

    def gradients(self, ids: Tensor, metric, **run) -> dict[str, Tensor]:
        """∂metric/∂(each reader's input), (T, D) each, of one run."""
        readers = self.readers()
        nudges = {r: torch.zeros(ids.size(1), self.d, dtype=torch.float64, requires_grad=True)
                  for r in readers}  # fmt: skip
        logits, _ = self.run(ids, nudges=nudges, **run)
        found = torch.autograd.grad(
            metric(logits[None]), [nudges[r] for r in readers], allow_unused=True
        )  # a held writer's readers: unused
        return {r: torch.zeros_like(nudges[r]) if g is None else g
                for r, g in zip(readers, found, strict=True)}  # fmt: skip

    def edge_scores(self, clean: Tensor, corrupt: Tensor, metric, steps: int,
                    over: str = "inputs") -> dict:  # fmt: skip
        """EAP-IG by hand: (writer, reader) → scores per position (T,), each reader's
        gradient averaged over the left Riemann points α = k / steps of the path of the
        inputs (the embeddings) or, for each writer, of its own group's writes."""
        _, clean_writes = self.run(clean)
        _, corrupt_writes = self.run(corrupt)
        groups = [list(clean_writes)] if over == "inputs" else self.groups()
        scores = {}
        for group in groups:
            total: dict[str, Tensor] = {}
            for k in range(steps):
                a = k / steps
                moved = {w: corrupt_writes[w] + a * (clean_writes[w] - corrupt_writes[w])
                         for w in (["embed"] if over == "inputs" else group)}  # fmt: skip
                for r, g in self.gradients(corrupt, metric, held=moved).items():
                    total[r] = total.get(r, 0) + g / steps
            for w in group:
                for r in total:
                    scores[w, r] = ((clean_writes[w] - corrupt_writes[w]) * total[r]).sum(-1)
        return scores
