"""The live page's carried parts: what its JavaScript needs to run the model on a typed text.

``tokenizer_spec(tokenizer)`` is the model's tokenizer as ``html/live-tokenize.js`` reads
it: a character vocabulary, or the parts of a ``tokenizers`` file that WordPiece (BERT's
normaliser and pre-tokeniser) and byte-level BPE (GPT-2's) use. A tokenizer built any other
way is refused in one line naming what the page cannot follow: the page must give the ids
Python gives, or say it cannot.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from torch import Tensor

from glassformer.data.tokenizers.base import CHAR_SPECIALS, UNK_ID
from glassformer.data.tokenizers.char import CharTokenizer
from glassformer.errors import LiveError
from glassformer.models.base import PAGES, PretrainedModel


def tokenizer_spec(tokenizer: Any) -> dict[str, Any]:
    """The tokenizer as the page's JavaScript reads it (see ``html/live-tokenize.js``)."""
    if isinstance(tokenizer, CharTokenizer):
        return {"type": "char", "chars": tokenizer.chars, "offset": len(CHAR_SPECIALS),
                "unk": UNK_ID, "lowercase": tokenizer.lowercase}  # fmt: skip
    kind = getattr(tokenizer, "kind", None)
    if kind not in ("wordpiece", "bpe"):
        name = kind or type(tokenizer).__name__
        raise LiveError(f"the live page tokenizes with char, WordPiece or byte-level BPE "
                        f"tokenizers; this one is {name!r}")  # fmt: skip
    spec = json.loads(tokenizer.to_json())
    model = spec.get("model") or {}
    vocab = model.get("vocab") or {}
    by_id = sorted(vocab, key=vocab.__getitem__)
    if [vocab[t] for t in by_id] != list(range(len(by_id))):
        raise LiveError("the tokenizer's vocabulary does not number its tokens 0, 1, 2, ...")
    added = [_added(token) for token in spec.get("added_tokens") or []]
    if kind == "wordpiece":
        return {"type": "wordpiece", "vocab": by_id, "added": added, **_wordpiece(spec, model)}
    return {"type": "bpe", "vocab": by_id, "added": added, **_bpe(spec, model)}


def _added(token: dict[str, Any]) -> dict[str, Any]:
    """A special token the page finds in the raw text; the kinds it cannot follow refused."""
    flags = [f for f in ("normalized", "lstrip", "rstrip", "single_word") if token.get(f)]
    if flags:
        raise LiveError(f"the added token {token.get('content')!r} is {', '.join(flags)}: "
                        "the live page matches added tokens in the raw text only")  # fmt: skip
    return {"content": token["content"], "id": token["id"]}


def _wordpiece(spec: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    normalizer, pre = spec.get("normalizer") or {}, spec.get("pre_tokenizer") or {}
    if normalizer.get("type") != "BertNormalizer" or pre.get("type") != "BertPreTokenizer":
        raise LiveError(f"the live page follows WordPiece after BERT's normaliser and "
                        f"pre-tokeniser; this one has {normalizer.get('type')} and "
                        f"{pre.get('type')}")  # fmt: skip
    lowercase = bool(normalizer.get("lowercase"))
    strip = normalizer.get("strip_accents")
    return {"unk": model.get("unk_token", "[UNK]"),
            "prefix": model.get("continuing_subword_prefix", "##"),
            "maxChars": model.get("max_input_chars_per_word", 100), "lowercase": lowercase,
            "stripAccents": lowercase if strip is None else bool(strip),
            "cleanText": bool(normalizer.get("clean_text")),
            "chinese": bool(normalizer.get("handle_chinese_chars"))}  # fmt: skip


def _bpe(spec: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    normalizer, pre = spec.get("normalizer"), spec.get("pre_tokenizer") or {}
    byte_level = pre.get("type") == "ByteLevel" and not pre.get("add_prefix_space")
    if not byte_level or pre.get("use_regex") is False:
        raise LiveError(f"the live page follows GPT-2's byte-level BPE (its regex, no prefix "
                        f"space); this one pre-tokenizes with {pre}")  # fmt: skip
    if normalizer not in (None, {"type": "Lowercase"}):
        raise LiveError(f"the live page lower-cases or leaves the text; this BPE normalises "
                        f"with {normalizer.get('type')}")  # fmt: skip
    odd = [k for k in ("dropout", "continuing_subword_prefix", "end_of_word_suffix")
           if model.get(k)]  # fmt: skip
    if odd or model.get("byte_fallback"):
        raise LiveError(f"the live page's BPE has no {', '.join(odd) or 'byte fallback'}")
    merges = [m.split(" ") if isinstance(m, str) else list(m) for m in model.get("merges", [])]
    return {"merges": merges, "unk": model.get("unk_token"), "lowercase": normalizer is not None,
            "ignoreMerges": bool(model.get("ignore_merges"))}  # fmt: skip


# ---- the live page: the explorable page, run by the page itself ---------------------------

# the kinds whose steps have rules: the one-stack text models (BERT's too), the ViT and the
# translator (a model of them whose step has none, T5's relative position bias, gets the
# page of one text, saying which step)
LIVE_KINDS = ("gpt", "gpt_classifier", "classifier", "encoder_lm", "bert", "bert_classifier", "vit",
              "seq2seq")  # fmt: skip
LIVE_MAX_PARAMS = 5_000_000  # larger models keep the page of one fixed text
LIVE_MAX_BYTES = 8_000_000  # the page's goal: over this, its weights carry fewer bits
PAGE_BYTES = 120_000  # the page's scripts and styles, which the weights' budget leaves room for


def live_refusal(model: PretrainedModel) -> str | None:
    """Why ``model`` gets the page of one fixed text rather than a live one (None: it can)."""
    kind = getattr(model, "kind", None)
    if kind not in LIVE_KINDS:
        return f"the live page runs {', '.join(LIVE_KINDS)} models; this is {kind!r}"
    params = sum(p.numel() for p in model.parameters())
    if params > LIVE_MAX_PARAMS:
        return (f"the live page carries models of up to {LIVE_MAX_PARAMS:,} parameters; this "
                f"has {params:,}")  # fmt: skip
    return None


def live_data(
    model: PretrainedModel,
    tokenizer: Any,
    text: str,
    labels: list[str] | None = None,
    calibration: Sequence[str] = (),
) -> dict:
    """The live page's data: the explorable page's steps with a rule each instead of values,
    the weights the rules read (``live_weights``: float32, with fewer mantissa bits where the
    page would be over ``LIVE_MAX_BYTES``, each step then stating its bound as measured on
    ``text``, the ``calibration`` texts and seeded ones), the tokenizer, and what the output
    panel needs."""
    from glassformer.viz.derive import _json
    from glassformer.viz.explain import _collect, _forward
    from glassformer.viz.live_steps import live_program
    from glassformer.viz.live_weights import carried
    from glassformer.viz.page import embed_json

    why = live_refusal(model)
    if why is not None:
        raise LiveError(why)
    spec = None if model.kind == "vit" else tokenizer_spec(tokenizer)
    forward = _forward(model, tokenizer, text, None)
    data, _, full = _collect(model, *forward, columns=10**9)
    ids = _ids(model, tokenizer, text)  # a ViT's: its image (C, H, W)
    rules, weights, tables = live_program(model, data["steps"], full, ids)
    for step, rule in zip(data["steps"], rules, strict=True):
        step.pop("derive", None)
        step["live"] = rule
    if labels is not None and data["output"] and data["output"]["kind"] == "classes":
        from glassformer.viz.explain import _class_names

        labels = data["output"]["labels"] = _class_names(labels, len(data["output"]["labels"]))
    # the output panel's kind is the page of one text's (None: a bare encoder, BERT's)
    data["live"] = {**_input_output(model, tokenizer, spec, labels, ids),
                    "output": data["output"]["kind"] if data["output"] else None}  # fmt: skip
    data["tables"] = {name: _json(table) for name, table in tables.items()}  # rotary's, max_len
    budget = LIVE_MAX_BYTES - PAGE_BYTES - len(embed_json(data))
    inputs = [ids] + [_ids(model, tokenizer, t) for t in calibration if model.kind != "vit"]
    data["live"]["weights"], bounds, data["live"]["why"] = carried(
        model, data["steps"], rules, weights, tables, budget, inputs
    )
    for step, bound in zip(data["steps"], bounds or [], strict=False):
        step["bound"] = bound
    data["precision"] = "f32"
    return data


def _ids(model: PretrainedModel, tokenizer: Any, text: str) -> Any:
    """The ids the model reads for ``text`` (``model_inputs``: cut to its length as the page
    cuts them, ``frame``); a ViT's image (C, H, W), ``text`` its file; a translator's
    ``{"source": ..., "target": its greedy translation from BOS, without EOS}``."""
    from glassformer.viz.attention import model_inputs

    args = model_inputs(model, tokenizer, text)[0]
    if model.kind == "seq2seq":
        return {"source": args[0][0], "target": args[1][0]}
    return args[0][0]


def _input_output(
    model: PretrainedModel,
    tokenizer: Any,
    spec: dict | None,
    labels: list[str] | None,
    ids: Tensor,
) -> dict:
    """What the page reads (the tokenizer and how the ids are cut, a translator's decoding, a
    ViT's image) and what it shows (the tokens' labels, the classes)."""
    from glassformer.viz.attention import token_labels

    classes = getattr(model.config, "num_classes", None)
    if model.kind == "vit":
        channels, *size = (int(n) for n in ids.shape)
        return {"image": {"channels": channels, "size": size, "pixels": ids.flatten().tolist()},
                "classes": labels or [str(c) for c in range(classes or 0)]}  # fmt: skip
    c = model.config
    vocab = c.tgt_vocab_size if model.kind == "seq2seq" else c.vocab_size
    shown = token_labels(tokenizer, list(range(vocab)))
    frame = {"keep": "last" if model.kind == "gpt" else "first", "max": c.max_len}
    if model.kind in ("bert", "bert_classifier"):  # [CLS] text [SEP], the text cut between
        frame.update(cls=tokenizer.bos_id, sep=tokenizer.eos_id)
    return {
        "tokenizer": spec,
        "frame": frame,
        # a translator decodes greedily from BOS to EOS, at most 2·source + 10 tokens
        **({"decode": {"bos": c.bos_id, "eos": c.eos_id}} if model.kind == "seq2seq" else {}),
        # the tokens as shown, where they are not the tokenizer's own vocabulary
        "labels": None if spec and shown == spec.get("vocab") else shown,
        "classes": labels or [str(n) for n in range(classes or 0)],
    }


def live_html(
    model: PretrainedModel,
    tokenizer: Any,
    text: str,
    labels: list[str] | None = None,
    calibration: Sequence[str] = (),
) -> Any:
    """The live page for ``model``, opening on ``text`` (an ``AttentionView``): the reader
    types any text and the page runs the model on it and redraws every level
    (``calibration``: texts like the ones it will read, see ``live_data``)."""
    from glassformer.viz.page import render
    from glassformer.viz.viewer import LIVE_SCRIPTS, AttentionView

    data = live_data(model, tokenizer, text, labels, calibration)
    data["title"] = f"{model.kind} model: its forward pass, run in this page"
    values = data["live"]["weights"].pop("values")  # (read faster outside the JSON)
    page = render("explain.html", ("viewer.css", "explain.css"), LIVE_SCRIPTS, data,
                  title="glassformer: a forward pass, live", data_id="explain-data",
                  inert={"live-weights": values})  # fmt: skip
    return AttentionView(page)


def try_live(
    model: PretrainedModel,
    tokenizer: Any,
    text: str,
    labels: list[str] | None = None,
    calibration: Sequence[str] = (),
) -> tuple[Any, str | None]:
    """``(the live page, None)``, or ``(None, why the model gets the page of one text)``."""
    why = live_refusal(model)
    if why is None:
        try:
            return live_html(model, tokenizer, text, labels, calibration), None
        except LiveError as err:
            why = str(err)
    return None, why


def explain_page(
    model: PretrainedModel,
    tokenizer: Any,
    text: str,
    *,
    target: str | None = None,
    labels: list[str] | None = None,
    live: bool | None = False,
    calibration: Sequence[str] = (),
) -> Any:
    """The page ``model.explain(tokenizer, text, **options)`` makes: the page of ``text``
    (``glassformer.viz.explain.explain_html``; a translator's with ``target``, if given).
    ``live=None`` makes the live page instead where the model can have one; ``live=True``
    makes it or says in one line why it cannot (``LiveError``)."""
    from glassformer.viz.explain import explain_html

    if live is not False and target is None:
        page, why = try_live(model, tokenizer, text, labels, calibration)
        if page is not None:
            return page
        if live:
            raise LiveError(why)
    return explain_html(model, tokenizer, text, target=target, labels=labels)


PAGES["explain"] = explain_page
