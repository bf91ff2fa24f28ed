"""The edges between a model's components: who writes to the residual stream, who reads it.

A pre-norm block's stream is a sum: the embeddings, then what every attention head and
every MLP adds. A component reads the sum of the writes before it. Seen that way the model
is a graph whose edges are (writer → reader) pairs:

- writers: ``"embed"``, ``"L{layer}.H{h}"`` (one head's share of the attention output),
  ``"L{layer}.mlp"``;
- readers: ``"L{layer}.H{h}.q"`` (the stream as head h's query reads it; ``.k`` and ``.v``
  for the key and value heads, fewer under grouped-query attention), ``"L{layer}.mlp"``,
  ``"logits"``.

``EdgeGraph`` names them for one model and computes two things on them:
- the gradient of a metric with respect to the stream *as one reader alone reads it*
  (``reader_gradients``), for edge attribution;
- a run in which each reader reads its own stream (``split_reads``): every edge outside
  a circuit carries the corrupted run's write, every edge inside it the write of the run
  itself (``evaluate_circuit``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from glassformer.inspect.patching import per_layer
from glassformer.models.base import PretrainedModel
from glassformer.modules.attention import MultiHeadAttention
from glassformer.modules.heads import linear_rows

WRITES = ("attn.hook_result", "hook_mlp_out", "hook_attn_out", "hook_resid_pre", "hook_resid_post")


class EdgeGraph:
    """The writers, readers and real edges of a model with ``layers`` blocks named
    ``{block}.{i}`` (``blocks.3``, or a translator's ``decoder.blocks.3``)."""

    def __init__(self, model: PretrainedModel, stack: str | None = None) -> None:
        inputs = per_layer(model, "hook_resid_pre", stack)
        self.model = model
        self.block, self.layers = inputs[0].rsplit(".", 2)[0], len(inputs)
        known = set(model.hook_names())
        if self.at(0, "hook_cross_attn_out") in known:
            raise ValueError(
                "edge attribution reads blocks of self-attention and an MLP; a translator's "
                "decoder (cross-attention) is not covered: use attribution_patching"
            )
        self.parallel = self.at(0, "hook_resid_mid") not in known
        self.mlp_reads = [self._mlp_input(i, known) for i in range(self.layers)]
        attn = model.get_submodule(self.at(0, "attn"))
        self.heads = int(getattr(attn, "num_heads", 0))
        self.kv_heads = int(getattr(attn, "num_kv_heads", self.heads))
        self.writer_names = [self.at(i, name) for i in range(self.layers) for name in WRITES]
        self.writers = ["embed"] + [
            name
            for i in range(self.layers)
            for name in [*(f"L{i}.H{h}" for h in range(self.heads)), f"L{i}.mlp"]
        ]
        self.readers = [name for i in range(self.layers) for name in self.reads(i)] + ["logits"]
        self.edges = self.edge_mask(self.writers, self.readers)

    def at(self, layer: int, name: str) -> str:
        return f"{self.block}.{layer}.{name}"

    def reads(self, layer: int) -> list[str]:
        """Block ``layer``'s readers, in order: q heads, k heads, v heads, the MLP."""
        qkv = [(x, self.heads if x == "q" else self.kv_heads) for x in "qkv"]
        return [f"L{layer}.H{h}.{x}" for x, n in qkv for h in range(n)] + [f"L{layer}.mlp"]

    def _mlp_input(self, layer: int, known: set[str]) -> str:
        for name in ("hook_resid_mid", "hook_resid_pre"):
            if self.at(layer, name) in known:
                return self.at(layer, name)
        raise ValueError(f"block {layer} has no residual stream hook points")

    def names(self) -> list[str]:
        """What a gradient run keeps live: writers' outputs, readers' inputs, their norms'
        outputs and the q, k and v."""
        names = set(self.writer_names) | set(self.mlp_reads)
        for i in range(self.layers):
            names |= {self.at(i, f"attn.hook_{x}") for x in "qkv"}
            names |= {self.at(i, "ln1.hook_normalized"), self.mlp_norm(i)[0]}
        return sorted(names)

    def check_additive(self, cache: Any) -> None:
        """The stream must be the sum of the writes: each block's output equals its input plus
        its attention output plus its MLP output (and the heads' results sum to the former)."""
        for i in range(self.layers):
            before = cache[self.at(i, "hook_resid_pre")]
            after = cache[self.at(i, "hook_resid_post")]
            written = cache[self.at(i, "hook_attn_out")] + cache[self.at(i, "hook_mlp_out")]
            heads = cache[self.at(i, "attn.hook_result")].sum(2)
            bias = cache[self.at(i, "hook_attn_out")] - heads  # the output bias, everywhere
            scale = after.abs().max().clamp_min(1.0)
            if ((after - before - written).abs().max() > 1e-4 * scale
                    or (bias - bias[:, :1]).abs().max() > 1e-4 * scale):  # fmt: skip
                raise ValueError(
                    f"edge attribution needs a residual stream that is the sum of what each "
                    f"component writes; block {i} normalises after the sum or on a sub-layer's "
                    "output (post-norm, sandwich norms): use attribution_patching for its nodes"
                )

    def writes(self, cache: Any) -> Tensor:
        """Every writer's output at every position, (W, B, T, D), from a cache of
        ``writer_names``."""
        rows = [cache[self.at(0, "hook_resid_pre")]]
        for i in range(self.layers):
            rows += list(cache[self.at(i, "attn.hook_result")].unbind(2))  # (B, T, D) each
            rows.append(cache[self.at(i, "hook_mlp_out")])
        return torch.stack(rows)

    def reader_gradients(self, live: dict[str, Tensor], grads: dict[str, Tensor]) -> Tensor:
        """∂M/∂(the stream as each reader alone reads it), at each position: (R, B, T, D).

        A head's reader is the stream through the norm and that head's rows of the q, k or
        v projection: the gradient at those rows' output times the rows gives the gradient
        at the norm's output along that head alone, and one vector-Jacobian product through
        the norm, batched over the block's heads (``is_grads_batched``), takes it to the
        stream. An MLP's norm feeds that MLP alone: the gradient at its output is the MLP's."""
        rows: list[Tensor] = []
        for i in range(self.layers):
            attn = self.attention(i)
            heads = self._head_cotangents(attn, i, grads)
            if heads is None:  # clipped projections: through the projection too
                heads = self._through_projection(i, live, grads)
                rows.append(heads)
            else:
                normed = self.at(i, "ln1.hook_normalized")
                rows.append(_vjp([live[normed]], live[self.at(i, "hook_resid_pre")], [heads]))
            norm_name = self.mlp_norm(i)[0]
            if norm_name.endswith("ln1.hook_normalized"):  # one norm for both: the MLP's path
                mlp = self.at(i, "hook_mlp_out")
                cotangent, through = grads[f"{mlp}_grad"], live[mlp]
            else:
                cotangent, through = grads[f"{norm_name}_grad"], live[norm_name]
            rows.append(_vjp([through], live[self.mlp_reads[i]], [cotangent[None]]))
        rows.append(grads[self.at(self.layers - 1, "hook_resid_post") + "_grad"][None])
        return torch.cat(rows)

    def attention(self, layer: int) -> MultiHeadAttention:
        attn = self.model.get_submodule(self.at(layer, "attn"))
        if not isinstance(attn, MultiHeadAttention):
            raise ValueError(f"edges read MultiHeadAttention's projections, not {type(attn)}")
        return attn

    def _head_cotangents(
        self, attn: MultiHeadAttention, layer: int, grads: dict[str, Tensor]
    ) -> Tensor | None:
        """For each head reader (q heads, k heads, v heads), the gradient at the norm's
        output along that head's projection rows alone: (slots, B, T, D); None where the
        projections are clipped (the clamp's gradient needs its input)."""
        if attn.clip is not None:
            return None
        H, Hkv, Dh = attn.num_heads, attn.num_kv_heads, attn.head_dim
        weight = attn.qkv_proj.weight
        parts, start = [], 0
        for which, n in (("q", H), ("k", Hkv), ("v", Hkv)):
            g = grads[self.at(layer, f"attn.hook_{which}") + "_grad"]  # (B, T, n, Dh)
            rows = weight[start : start + n * Dh].view(n, Dh, -1).to(g.dtype)
            parts.append(torch.einsum("bthe,hed->hbtd", g, rows))
            start += n * Dh
        return torch.cat(parts)

    def _through_projection(
        self, layer: int, live: dict[str, Tensor], grads: dict[str, Tensor]
    ) -> Tensor:
        """The head readers' gradients by vector-Jacobian products from q, k and v."""
        names = [self.at(layer, f"attn.hook_{x}") for x in "qkv"]
        outs = [live[name] for name in names]
        slots = self.heads + 2 * self.kv_heads
        batched = [torch.zeros(slots, *out.shape, dtype=out.dtype) for out in outs]
        s = 0
        for which, name in enumerate(names):
            grad = grads[f"{name}_grad"]
            for h in range(grad.size(2)):
                batched[which][s, :, :, h] = grad[:, :, h]
                s += 1
        return _vjp(outs, live[self.at(layer, "hook_resid_pre")], batched)

    def edge_mask(self, writers: list[str], readers: list[str]) -> Tensor:
        """True where the writer's output is in the stream the reader reads."""

        def order(name: str) -> float:
            if name in ("embed", "logits"):
                return -1.0 if name == "embed" else float(self.layers)
            layer = float(name.split(".")[0][1:])
            # within a block: attention writes before the (sequential) MLP reads
            return layer + (0.5 if name.endswith("mlp") and not self.parallel else 0.0)

        w = torch.tensor([order(n) for n in writers])
        r = torch.tensor([order(n) for n in readers])
        return w[:, None] < r[None, :]

    def split_reads(self, outside: Tensor, corrupt: Any) -> list[tuple[Any, Callable]]:
        """Hooks for a run in which reader r reads the stream minus, for every writer w with
        ``outside[w, r]``, (w's output in this run − w's output in the corrupted run): the
        edge w → r carries the corrupted write. ``corrupt`` caches ``split_names()`` of the
        corrupted run. A reader with no edge outside is left alone; one with every edge
        outside reads the corrupted run's own values."""
        return _SplitReads(self, outside, corrupt).hooks()

    def split_names(self) -> list[str]:
        """What ``split_reads`` needs of the corrupted run."""
        names = [self.at(self.layers - 1, "hook_resid_post")]
        for i in range(self.layers):
            names += sorted({self.at(i, "hook_resid_pre"), self.mlp_reads[i]})
            names += [self.at(i, f"attn.hook_{x}") for x in ("q", "k", "v", "z")]
            names += [self.at(i, "hook_mlp_out"), self.mlp_norm(i)[0]]
        return names

    def mlp_norm(self, layer: int) -> tuple[str, nn.Module]:
        """The hook point of the MLP's normalised input, and the norm that makes it."""
        block = self.model.get_submodule(f"{self.block}.{layer}")
        name = "ln2" if getattr(block, "ln2", None) is not None else "ln1"
        norm = getattr(block, name, None)
        if norm is None or not getattr(block, "norm_first", False):
            raise ValueError(f"block {layer}'s MLP reads no pre-norm: circuits need pre-norm")
        return self.at(layer, f"{name}.hook_normalized"), norm


def _vjp(outputs: list[Tensor], stream: Tensor, grads: list[Tensor]) -> Tensor:
    """For each row s of ``grads`` (each (S, *output.shape)): Σ grads[s] · ∂outputs/∂stream,
    (S, B, T, D)."""
    found = torch.autograd.grad(
        outputs, stream, grads, retain_graph=True, allow_unused=True, is_grads_batched=True
    )[0]
    return torch.zeros(len(grads[0]), *stream.shape) if found is None else found


class _SplitReads:
    """The hooks of ``EdgeGraph.split_reads`` and the values they pass between them."""

    def __init__(self, graph: EdgeGraph, outside: Tensor, corrupt: Any) -> None:
        self.graph, self.corrupt = graph, corrupt
        self.outside = outside.float()
        counted = outside.sum(0)
        real = graph.edges.sum(0)
        self.mixed = (counted > 0) & (counted < real)  # readers that read their own stream
        self.all_out = (counted == real) & (real > 0)
        self.index = {name: r for r, name in enumerate(graph.readers)}
        self.deltas: Tensor | None = None  # (W, B, T, D): this run's writes − the corrupted
        self.stream: dict[float, Tensor] = {}  # layer (+ 0.5: the MLP's) → the stream
        self.heads_read: dict[int, Tensor] = {}  # layer → (slots, B, T, Dh) q/k/v per head
        self.inside = False  # computing a norm of our own: its hook point passes it on
        self.shared = {i: graph.mlp_norm(i)[0].endswith("ln1.hook_normalized")
                       for i in range(graph.layers)}  # fmt: skip

    def hooks(self) -> list[tuple[Any, Callable]]:
        g = self.graph
        every = range(g.layers)
        hooks: list[tuple[Any, Callable]] = [
            ([g.at(i, "hook_resid_pre") for i in every], self.resid_pre),
            ([g.at(i, "attn.hook_z") for i in every], self.heads_write),
            ([g.at(i, "hook_mlp_out") for i in every], self.mlp_writes),
            ([g.mlp_norm(i)[0] for i in every], self.mlp_reads),
            ([g.at(i, f"attn.hook_{x}") for i in every for x in "qkv"], self.qkv),
            (g.at(g.layers - 1, "hook_resid_post"), self.logits_read),
        ]
        if not g.parallel:
            hooks.append(([g.at(i, "hook_resid_mid") for i in every], self.resid_mid))
        return hooks

    def layer(self, name: str) -> int:
        return int(name[len(self.graph.block) + 1 :].split(".", 1)[0])

    def record(self, w: int, value: Tensor, corrupt: Tensor) -> None:
        if self.deltas is None:
            self.deltas = value.new_zeros(len(self.graph.writers), *value.shape)
        self.deltas[w] = value - corrupt

    def resid_pre(self, value: Tensor, name: str) -> None:
        i = self.layer(name)
        self.stream[i] = value
        if i == 0:
            self.record(0, value, self.corrupt[name])
        if self.graph.parallel:
            self.stream[i + 0.5] = value  # the parallel MLP reads the block's input

    def resid_mid(self, value: Tensor, name: str) -> None:
        self.stream[self.layer(name) + 0.5] = value

    def heads_write(self, value: Tensor, name: str) -> None:
        attn = self.graph.attention(self.layer(name))
        W = attn.out_proj.weight.view(attn.d_model, attn.num_heads, attn.head_dim)
        ours = torch.einsum("bthd,mhd->hbtm", value, W)
        theirs = torch.einsum("bthd,mhd->hbtm", self.corrupt[name], W)
        first = 1 + self.layer(name) * (self.graph.heads + 1)
        for h in range(self.graph.heads):
            self.record(first + h, ours[h], theirs[h])

    def mlp_writes(self, value: Tensor, name: str) -> None:
        self.record((self.layer(name) + 1) * (self.graph.heads + 1), value, self.corrupt[name])

    def read(self, readers: list[int], stream: Tensor, theirs: Tensor) -> Tensor:
        """The stream as each of ``readers`` reads it, (n, B, T, D): this run's ``stream``
        minus what its outside edges add, or, where fewer edges are inside, the corrupted
        run's stream (``theirs``) plus what its inside edges add; one product for them all,
        over the writers that take part."""
        assert self.deltas is not None
        real = self.graph.edges[:, readers].T  # (n, W)
        outside = self.outside[:, readers].T > 0
        inside = real & ~outside
        few = inside.sum(1) < outside.sum(1)  # (n,): from the corrupted stream
        weights = torch.where(few[:, None], inside.float(), -outside.float())
        used = weights.ne(0).any(0).nonzero().flatten()
        carried = weights[:, used].to(self.deltas.dtype) @ self.deltas[used].flatten(1)
        base = torch.where(few.view(-1, 1, 1, 1), theirs, stream)  # (n, B, T, D)
        return base + carried.view(len(readers), *stream.shape)

    def qkv(self, value: Tensor, name: str) -> Tensor:
        i, x = self.layer(name), name[-1]
        g = self.graph
        names = g.reads(i)[:-1]
        if i not in self.heads_read:
            self.heads_read[i] = self._heads(i, names)
        own = self.heads_read[i]
        out = None
        for h in range(value.size(2)):
            s = names.index(f"L{i}.H{h}.{x}")
            r = self.index[names[s]]
            if self.all_out[r] or self.mixed[r] or self.shared[i]:
                out = value.clone() if out is None else out
                out[:, :, h] = self.corrupt[name][:, :, h] if self.all_out[r] else own[s]
        return value if out is None else out

    def _heads(self, i: int, names: list[str]) -> Tensor:
        """Each head reader's q (k, v) of its own stream: (slots, B, T, Dh); the norm, then
        that head's rows of the projection."""
        g = self.graph
        attn = g.attention(i)
        block = g.model.get_submodule(f"{g.block}.{i}")
        stream = self.stream[i]
        readers = [self.index[n] for n in names]
        wanted = [s for s, r in enumerate(readers) if self.mixed[r] or self.shared[i]]
        out = stream.new_zeros(len(names), *stream.shape[:2], attn.head_dim)
        if not wanted:
            return out
        theirs = self.corrupt[g.at(i, "hook_resid_pre")]
        streams = self.read([readers[s] for s in wanted], stream, theirs)
        self.inside = True
        try:
            norm = getattr(block, "ln1", None)
            normed = norm(streams) if norm is not None else streams
        finally:
            self.inside = False
        Dh, H, Hkv = attn.head_dim, attn.num_heads, attn.num_kv_heads
        for n, s in enumerate(wanted):
            which, h = names[s][-1], int(names[s].split(".")[1][1:])
            start = {"q": 0, "k": H * Dh, "v": (H + Hkv) * Dh}[which] + h * Dh
            rows = linear_rows(attn.qkv_proj, normed[n], start, start + Dh)
            out[s] = rows if attn.clip is None else rows.clamp(-attn.clip, attn.clip)
        return out.view(len(names), *stream.shape[:2], attn.head_dim)

    def mlp_reads(self, value: Tensor, name: str) -> Tensor:
        if self.inside:
            return value
        i = self.layer(name)
        r = self.index[f"L{i}.mlp"]
        if self.all_out[r]:
            return self.corrupt[name]
        if not self.mixed[r]:
            return value
        norm = self.graph.mlp_norm(i)[1]
        self.inside = True
        try:
            theirs = self.corrupt[self.graph.mlp_reads[i]]
            return norm(self.read([r], self.stream[i + 0.5], theirs)[0])
        finally:
            self.inside = False

    def logits_read(self, value: Tensor, name: str) -> Tensor:
        r = self.index["logits"]
        if self.all_out[r]:
            return self.corrupt[name]
        return self.read([r], value, self.corrupt[name])[0] if self.mixed[r] else value
