"""What the family tests share: a random transformers model saved and opened by glassformer,
and the comparison of every activation both libraries expose.

``compare_activations`` checks, on one batch:
- the logits;
- ``output_hidden_states``: the stream before each block (``blocks.i.hook_resid_pre``)
  and the final norm's output (``ln_final.hook_normalized``);
- ``output_attentions`` (eager attention): each layer's weights (``attn.hook_pattern``);
- forward hooks on transformers' own modules, named by the family's ``module_map``: for
  each layer, e.g. its q/k/v projections against ``attn.hook_q``/``hook_k``/``hook_v``,
  its attention output against ``hook_attn_out``, its MLP against ``hook_mlp_out``.
Every one within ``ATOL``.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

ATOL = 1e-4
VOCAB = 97
# A small Llama-shaped decoder's config fields; no end token, so generation runs its length.
SMALL_DECODER = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
    attn_implementation="eager",
    bos_token_id=None,
    eos_token_id=None,
)
# Ten tokens: longer than the windows the tests slide.
IDS = torch.tensor([[5, 17, 3, 88, 42, 9, 60, 1, 33, 70], [7, 7, 30, 2, 96, 11, 4, 8, 19, 50]])
# transformers' modules of a Llama-shaped layer (Llama, Mistral, Qwen2, Qwen3) → glassformer's hooks
LLAMA_SHAPED = {
    "model.layers.{i}.input_layernorm": "blocks.{i}.ln1.hook_normalized",
    "model.layers.{i}.self_attn.q_proj": "blocks.{i}.attn.hook_q",
    "model.layers.{i}.self_attn.k_proj": "blocks.{i}.attn.hook_k",
    "model.layers.{i}.self_attn.v_proj": "blocks.{i}.attn.hook_v",
    "model.layers.{i}.self_attn": "blocks.{i}.hook_attn_out",
    "model.layers.{i}.post_attention_layernorm": "blocks.{i}.ln2.hook_normalized",
    "model.layers.{i}.mlp": "blocks.{i}.hook_mlp_out",
}


def with_config(path, **changes) -> None:
    """Change fields of the ``config.json`` in ``path`` (a hand-edited or hostile file)."""
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def check_refused(path, message: str, cls=None, **changes) -> None:
    """The directory ``path`` with its ``config.json`` changed by ``changes`` is refused in
    one line matching ``message`` (``cls``: the model class that opens it; GPT)."""
    from glassformer import GPT
    from glassformer.checkpoint import CheckpointError

    with_config(path, **changes)
    with pytest.raises(CheckpointError, match=message) as error:
        (cls or GPT).from_pretrained(path)
    assert "\n" not in str(error.value)


def randomize(
    model: torch.nn.Module,
    seed: int = 0,
    keep: tuple[str, ...] = (),
    norms: tuple[float, float] = (1.0, 0.2),
) -> None:
    """Every parameter drawn at random from its own seeded generator (norm weights around
    ``norms`` = (mean, std), the rest around 0 with std 0.1): transformers' initial zeros
    and ones would hide a wrong mapping. Parameters whose name contains one of ``keep`` stay
    (a fixed table stored as a parameter). Gemma's norm scales are offsets from 1: (0, 0.3)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(k in name for k in keep):
                continue
            noise = torch.randn(p.shape, generator=generator)
            if re.search(r"norm|ln_|layernorm", name) and name.endswith("weight"):
                p.copy_(norms[0] + norms[1] * noise)
            else:
                p.copy_(0.1 * noise)


def save_and_open(hf: torch.nn.Module, path, cls=None):
    """``hf`` saved as a Hugging Face directory at ``path`` and opened by glassformer."""
    from glassformer import GPT

    hf.save_pretrained(path)
    return (cls or GPT).from_pretrained(path)


def _flat(x: torch.Tensor, per_head: bool) -> torch.Tensor:
    """A per-head value (B, T, H, Dh) → (B, T, H·Dh), the layout of a projection's output."""
    return x.flatten(2) if per_head and x.dim() == 4 else x


def compare_activations(hf, ours, ids: torch.Tensor, module_map: dict) -> int:
    """Assert every activation both expose is equal within ``ATOL``; returns how many
    tensors were compared. ``module_map``: a transformers module name with ``{i}`` for the
    layer → the glassformer hook name (also with ``{i}``), or a function of (cache, i) that
    arranges glassformer's values as that module lays them out."""
    L = ours.config.num_layers
    hf.set_attn_implementation("eager")  # the one that returns attention weights
    seen: dict[str, torch.Tensor] = {}
    handles = []
    modules = dict(hf.named_modules())
    for theirs in module_map:
        for i in range(L):
            name = theirs.format(i=i)

            def keep(module, args, output, name=name):
                seen[name] = output[0] if isinstance(output, tuple) else output

            handles.append(modules[name].register_forward_hook(keep))
    try:
        with torch.no_grad():
            out = hf(ids, output_hidden_states=True, output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    mine, cache = ours.run_with_cache(ids)
    pairs = [("logits", out.logits, mine.logits)]
    for i in range(L):
        pairs.append((f"hidden {i}", out.hidden_states[i], cache[f"blocks.{i}.hook_resid_pre"]))
        pairs.append((f"attention {i}", out.attentions[i], cache[f"blocks.{i}.attn.hook_pattern"]))
        for theirs, hook in module_map.items():
            mine_i = hook(cache, i) if callable(hook) else cache[hook.format(i=i)]
            pairs.append((theirs.format(i=i), seen[theirs.format(i=i)], mine_i))
    if "ln_final.hook_normalized" in cache:  # (a post-norm stack may have no final norm)
        pairs.append(("final norm", out.hidden_states[L], cache["ln_final.hook_normalized"]))
    for what, expected, got in pairs:
        per_head = expected.dim() == 3 and got.dim() == 4  # q/k/v against a projection's output
        got = _flat(got, per_head)
        if expected.dim() == 2 and got.dim() == 3:  # OPT's MLP runs on (B·T, D)
            expected = expected.view(got.shape)
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0, msg=what)
    return len(pairs)


def check_generation(hf, ours, prompt: torch.Tensor, new_tokens: int = 20) -> None:
    """The same greedy tokens as transformers, cached and uncached."""
    ref = hf.generate(prompt, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    assert ref.size(1) == prompt.size(1) + new_tokens
    assert torch.equal(ours.generate(prompt, new_tokens), ref)
    assert torch.equal(ours.generate(prompt, new_tokens, use_cache=False), ref)


def check_precisions_and_tools(ours, inputs: tuple[torch.Tensor, ...]) -> None:
    """int8 close to fp32 (within 5% of the largest logit) and int4 generating; the logit
    lens ending in the model's logits; direct logit attribution's parts summing to the
    logits (pre-norm models without a soft cap); activation patching of the clean run into itself
    giving the clean metric everywhere; the viewer's data holding every layer's weights."""
    import copy

    from glassformer.data.tokenizers import CharTokenizer
    from glassformer.inspect import (
        activation_patching,
        direct_logit_attribution,
        logit_difference,
        logit_lens,
    )
    from glassformer.viz.viewer import attention_data

    seq2seq = ours.kind == "seq2seq"
    with torch.no_grad():
        logits = ours(*inputs).logits
        int8 = copy.deepcopy(ours).for_inference("int8")
        error = (int8(*inputs).logits.float() - logits).abs().max() / logits.abs().max()
    assert error < 0.05, f"int8 moved the logits by {error:.1%} of the largest"
    int4 = copy.deepcopy(ours).for_inference("int4")
    new = int4.generate(inputs[0][:1], 4)
    assert new.size(1) >= (2 if seq2seq else inputs[0].size(1) + 4)
    one = tuple(x[:1] for x in inputs)
    lens = logit_lens(ours, *one)
    torch.testing.assert_close(lens.logits[-1], logits[0], atol=1e-4, rtol=0)
    plain_sum = not seq2seq and all(b.norm_first for b in ours.blocks)
    if plain_sum and getattr(ours, "final_softcap", None) is None:  # the parts sum to the logits
        parts = direct_logit_attribution(ours, inputs[0][:1])
        torch.testing.assert_close(parts.logits.sum(0), logits[0, -1], atol=1e-3, rtol=1e-4)
    metric = logit_difference(3, 4)
    effect = activation_patching(ours, one, one, metric)
    torch.testing.assert_close(
        effect, torch.full_like(effect, float(metric(logits[:1]))), atol=1e-4, rtol=0
    )
    c = ours.config
    vocab = c.tgt_vocab_size if seq2seq else c.vocab_size
    specials = CharTokenizer("a").vocab_size - 1
    chars = CharTokenizer("".join(chr(33 + i) for i in range(vocab - specials)))  # all ids
    data = attention_data(ours, chars, "thecatsat", target="elgato" if seq2seq else None)
    layers = ours.config.num_decoder_layers if seq2seq else ours.config.num_layers
    assert all(kind["layers"] == layers or seq2seq for kind in data["kinds"])
    assert len(data["kinds"]) == (3 if seq2seq else 1)
