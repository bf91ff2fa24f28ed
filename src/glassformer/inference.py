"""Using a trained model: load a run, and (for the CLI and evaluation alike) translate or
classify texts with it, or fill in a masked word.

    >>> model, tokenizer = glassformer.load_run("runs/lm")              # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from glassformer.checkpoint import (
    FOREIGN_TOKENIZERS,
    NAMED_MODELS,
    NAMED_TOKENIZERS,
    CheckpointError,
    load_checkpoint,
    resolve_checkpoint_dir,
)
from glassformer.data.batching import pad_batch
from glassformer.data.images import IMAGE_PROCESSOR_FILE, load_image_processor
from glassformer.data.tokenizers import load_tokenizer
from glassformer.generation import GenerationConfig
from glassformer.hub import resolve as resolve_hub_id
from glassformer.models.base import PretrainedModel

LABELS_FILE = "labels.json"


def load_run(
    path: str | Path, *, kind: str | None = None, revision: str | None = None, **options: Any
) -> tuple[Any, Any]:
    """(model, tokenizer) of a run directory (or the checkpoint directory in one), a
    sentence-transformers directory, a llama.cpp GGUF file (its tokenizer read from the file),
    or a packaged model by name
    (``"SmolLM2-135M-Instruct"``, ``"all-MiniLM-L6-v2"``). For a vision run the second is
    its ``ImageProcessor`` (the size and channels of the images the model reads), else a
    ``Tokenizer``.

    Args:
        path: what ``glassformer train`` / ``glassformer.fit`` wrote (``--out``), its
            ``checkpoint/``, or a packaged model's name.
        kind: the model kind expected ("gpt", "seq2seq", "classifier", ...); another is
            an error.
        revision: for a Hugging Face Hub id (``"org/name"``), its branch, tag or commit.
        options: for a packaged model or a GGUF file, its loader's (``dtype=torch.bfloat16``
            or ``dtype="gguf"``: computing from the file's blocks, read straight into them).
    """
    if str(path) not in NAMED_MODELS:
        path = resolve_hub_id(path, revision)  # org/name: a Hub id, from the Hub's cache
    if str(path) in NAMED_MODELS:
        model = load_checkpoint(str(path), kind=kind, **options)
        if str(path) not in NAMED_TOKENIZERS:
            raise ValueError(f"the packaged model {path!r} comes without a tokenizer")
        return model, NAMED_TOKENIZERS[str(path)](model)
    suffix = Path(path).suffix
    if suffix in FOREIGN_TOKENIZERS and Path(path).is_file():  # a GGUF file: its own tokens
        model = load_checkpoint(path, kind=kind, **options)
        return model, FOREIGN_TOKENIZERS[suffix](Path(path))
    if options:
        raise TypeError(f"unexpected option(s) {sorted(options)} for a run directory")
    if (Path(path) / "modules.json").is_file():  # a sentence-transformers directory
        from glassformer.models.sentence import SentenceEncoder

        encoder = SentenceEncoder.from_pretrained(path)
        if kind is not None and kind != encoder.kind:
            raise CheckpointError(f"{path} holds a {encoder.kind!r} model, expected {kind!r}")
        return encoder, encoder.tokenizer
    model = load_checkpoint(path, kind=kind)
    ckpt = resolve_checkpoint_dir(path)
    if (ckpt / IMAGE_PROCESSOR_FILE).is_file():  # a vision run: images, no tokenizer
        processor = load_image_processor(ckpt)
        c = model.config
        if processor.image_size != c.image_size or processor.channels != c.channels:
            raise ValueError(
                f"{ckpt}/{IMAGE_PROCESSOR_FILE} says {processor.describe()}, but the model "
                f"reads {c.image_size[0]}×{c.image_size[1]} with {c.channels} channel(s)"
            )
        return model, processor
    if not any((ckpt / name).is_file() for name in ("tokenizer.json", "vocab.txt", "source.spm")):
        raise ValueError(f"{ckpt} has no tokenizer.json; was it written by `glassformer train`?")
    tokenizer = load_tokenizer(ckpt)
    _check_vocabulary(tokenizer.vocab_size, model, ckpt)
    return model, tokenizer


def _check_vocabulary(tokens: int, model: PretrainedModel, ckpt: Path) -> None:
    """The tokenizer must fit the model: the same size for glassformer's own runs; for a
    Hugging Face directory no larger (their embedding tables are often padded past the
    tokenizer, to a multiple of 64 or 128, for speed)."""
    vocab = getattr(model.config, "vocab_size", None) or model.config.tgt_vocab_size
    foreign = "model_type" in json.loads((ckpt / "config.json").read_text())
    if tokens > vocab or (tokens < vocab and not foreign):
        raise ValueError(f"the tokenizer in {ckpt} has {tokens} tokens, the model {vocab}")


def read_labels(path: str | Path) -> list[str]:
    """A classifier run's labels, in the order of the model's outputs."""
    ckpt = resolve_checkpoint_dir(path)
    file = ckpt / LABELS_FILE
    if not file.is_file():
        raise ValueError(f"{ckpt} has no {LABELS_FILE}; it is not a classifier run")
    try:
        labels = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, RecursionError):  # not JSON, not text, nested too deeply
        labels = None
    if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
        raise ValueError(f"{file} is not a JSON list of labels (strings)")
    return labels


def device_of(model) -> torch.device:
    """Where a model's weights are (the CPU for a model that is not a torch module)."""
    params = model.parameters() if isinstance(model, nn.Module) else iter(())
    return next(params, torch.empty(0)).device


def truncate(ids: list[int], max_len: int) -> list[int]:
    """Keep the head and the tail of a long sequence (reviews state their verdict at both ends)."""
    if len(ids) <= max_len:
        return ids
    head = max_len // 2
    return ids[:head] + ids[len(ids) - (max_len - head) :]


def translate_texts(
    model,
    tokenizer,
    texts: list[str],
    *,
    max_len: int | None = None,
    batch_size: int = 64,
    generation_config: GenerationConfig | None = None,
    **generate_kwargs,
) -> list[str]:
    """Translate a list of sentences with ``model.generate``; returns decoded strings.

    ``generation_config`` and ``generate_kwargs`` (its fields as keywords, overriding it,
    and ``generator``) go to ``generate`` unchanged.
    """
    limit = max_len or model.config.max_len - 1
    out: list[str] = [""] * len(texts)
    encoded = tokenizer.encode_batch(texts)
    order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
    device = device_of(model)
    model.eval()
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        sources = [encoded[i][:limit] or [tokenizer.unk_id] for i in idx]
        src = pad_batch(sources, tokenizer.pad_id).to(device)
        # Each sentence may take 1.5 times its own length + 10 tokens, whatever its batch
        # holds: the batch runs for the longest budget, and each row is cut to its own.
        budgets = [min(limit, int(len(ids) * 1.5) + 10) for ids in sources]
        ys = model.generate(
            src, max(budgets), generation_config=generation_config, **generate_kwargs
        )
        for i, row, budget in zip(idx, ys.tolist(), budgets, strict=True):
            out[i] = tokenizer.decode(_until_eos(row[1 : 1 + budget], tokenizer.eos_id))
    return out


def _until_eos(ids: list[int], eos_id: int) -> list[int]:
    return ids[: ids.index(eos_id)] if eos_id in ids else ids


def classifier_inputs(
    model: PretrainedModel, tokenizer: Any, texts: list[str], max_len: int
) -> list[list[int]]:
    """The ids a classifier reads for each text, at most ``max_len`` (head and tail kept).
    A BERT-style one (fine-tuned from all-MiniLM-L6-v2 or BERT) reads them framed by
    ``[CLS]`` and ``[SEP]``, as it was pretrained."""
    framed = getattr(model, "kind", None) == "bert_classifier"
    limit = max_len - 2 if framed else max_len
    out = []
    for ids in tokenizer.encode_batch(texts):
        ids = truncate(ids, limit) or ([] if framed else [tokenizer.unk_id])
        out.append([tokenizer.bos_id, *ids, tokenizer.eos_id] if framed else ids)
    return out


def classify_texts(
    model,
    tokenizer,
    labels: list[str],
    texts: list[str],
    *,
    max_len: int | None = None,
    batch_size: int = 64,
) -> list[tuple[str, float]]:
    """(label, probability) for each text."""
    encoded = classifier_inputs(model, tokenizer, texts, max_len or model.config.max_len)
    out: list[tuple[str, float]] = []
    device = device_of(model)
    model.eval()
    with torch.no_grad():
        for start in range(0, len(encoded), batch_size):
            ids = pad_batch(encoded[start : start + batch_size], tokenizer.pad_id)
            ids = ids.to(device)
            probs = model(ids).logits.float().softmax(-1)
            p, k = probs.max(-1)
            out += [(labels[i], float(q)) for i, q in zip(k.tolist(), p.tolist(), strict=True)]
    return out


@torch.no_grad()
def classify_images(
    model: PretrainedModel, labels: list[str], images: Tensor, *, batch_size: int = 256
) -> list[tuple[str, float]]:
    """(label, probability) for each image of ``images`` (N, C, H, W), pixels 0..1."""
    out: list[tuple[str, float]] = []
    was_training = model.training
    model.eval()
    device = device_of(model)
    for start in range(0, len(images), batch_size):
        probs = model(images[start : start + batch_size].to(device)).logits.float().softmax(-1)
        p, k = probs.max(-1)
        out += [(labels[i], float(q)) for i, q in zip(k.tolist(), p.tolist(), strict=True)]
    model.train(was_training)
    return out


@torch.no_grad()
def fill_mask(
    model: PretrainedModel, tokenizer: Any, text: str, *, top_k: int = 5
) -> list[list[tuple[str, float]]]:
    """The ``top_k`` (token, probability) guesses for each ``[MASK]`` in ``text``, in order.

    Raises:
        ValueError: the text has no [MASK], or the tokenizer has none.
    """
    mask_id = getattr(tokenizer, "mask_id", None)
    if mask_id is None:
        raise ValueError("the tokenizer has no [MASK] token")
    ids = tokenizer.encode(text)
    positions = [i for i, t in enumerate(ids) if t == mask_id]
    if not positions:
        raise ValueError(f"{text!r} has no [MASK] to fill")
    limit = model.config.max_len
    if len(ids) > limit:
        raise ValueError(f"the text is {len(ids)} tokens; the model reads at most {limit}")
    was_training = model.training
    model.eval()
    logits = model(torch.tensor([ids], device=device_of(model))).logits[0]  # (T, V)
    model.train(was_training)
    out = []
    for position in positions:
        probs = logits[position].float().softmax(-1)
        p, k = probs.topk(min(top_k, probs.numel()))
        out.append([(tokenizer.id_to_token(int(i)), float(q)) for q, i in zip(p, k, strict=True)])
    return out
