"""Classification: an encoder reads a text and names its label (Bloem's classifier).

Training batches are buckets of texts of similar length (long texts keep their head and
tail); evaluation is loss and accuracy on the validation split; the held-out report is
accuracy on the test split; the show is a few validation texts with their verdicts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import Any

from torch import nn

from glassformer.data.images import ImageProcessor
from glassformer.data.tokenizers import Tokenizer
from glassformer.inference import classifier_inputs, classify_texts
from glassformer.models import (
    BertClassifier,
    BertClassifierConfig,
    BertConfig,
    ClassifierConfig,
    GPTClassifier,
    GPTClassifierConfig,
    GPTConfig,
    TransformerClassifier,
)
from glassformer.models.base import ModelConfig
from glassformer.training.config import RunConfig, filled
from glassformer.training.distributed import Distributed
from glassformer.training.evaluation import score
from glassformer.training.losses import loss_for
from glassformer.training.tasks.common import (
    MappedBatches,
    Task,
    labels_file,
    load_splits,
    model_overrides,
    text_tokenizer,
    tokenizer_files,
)

SHOWN = 6  # validation texts the show classifies
Example = tuple[list[int], int]  # a text's ids and its label's index


def build(
    config: RunConfig,
    *,
    tokenizer: Tokenizer | ImageProcessor | None = None,
    labels: list[str] | None = None,
    world: Distributed,
) -> ClassifyTask:
    """A classifier (of the config's preset, or with ``--init``'s backbone and tokenizer),
    its labels (a resumed run's ``labels``, or the training rows') and its texts."""
    source = None
    max_len = filled(config.max_len)
    if config.init is not None:  # the backbone, and its tokenizer, come from a pretrained model
        source, init_tokenizer = load_pretrained_encoder(
            config.init, max_len, model_overrides(config)
        )
        if tokenizer is not None and tokenizer.to_json() != init_tokenizer.to_json():
            raise ValueError(f"the run's tokenizer is not the one of --init {config.init}")
        tokenizer = init_tokenizer
    train_rows, val_rows, test_rows, description = load_splits(config)
    train_rows = train_rows[: config.max_examples]
    resumed = labels is not None
    labels = labels or sorted({label for _, label in train_rows})
    if len(labels) < 2:
        raise ValueError(f"classification needs at least 2 labels, found {labels}")
    _check_labels(config, train_rows if resumed else val_rows, labels, resumed)
    tok = text_tokenizer(config, tokenizer, [t for t, _ in train_rows])
    if source is not None:
        model = classifier_from_encoder(source, len(labels), linear_probe=config.linear_probe)
    else:
        shape = dict(vocab_size=tok.vocab_size, num_classes=len(labels), max_len=max_len,
                     pad_id=tok.pad_id)  # fmt: skip
        model = new_classifier(config, {**shape, **model_overrides(config)})
    return _task(config, tok, model, labels, (train_rows, val_rows, test_rows), description, world)


def new_classifier(config: RunConfig, fields: dict[str, Any]) -> Any:
    """A classifier from random weights of ``--arch``'s shape at ``--preset``'s size."""
    if config.arch == "gpt":
        return GPTClassifier(GPTClassifierConfig.preset(config.preset, **fields))
    return TransformerClassifier(ClassifierConfig.preset(config.preset, **fields))


def _task(config, tok, model, labels, splits, description, world) -> ClassifyTask:
    """The task, once its model and tokenizer are made: the examples and their batches."""
    from glassformer.data.batching import BucketBatches

    train_rows, val_rows, test_rows = splits
    collate = partial(collate_labelled, pad_id=tok.pad_id)
    buckets = BucketBatches(
        examples(config, model, tok, labels, train_rows), filled(config.batch_size),
        key=_length, seed=config.seed, rank=world.rank, world_size=world.world_size,
    )  # fmt: skip
    val_examples = examples(config, model, tok, labels, val_rows)
    return ClassifyTask(
        config=config,
        tokenizer=tok,
        model=model,
        batches=MappedBatches(buckets, collate),
        loss_fn=loss_for("classify"),
        extra_files={**tokenizer_files(tok), "labels.json": labels_file(labels)},
        description=description,
        labels=labels,
        val_rows=val_rows,
        val_batches=fixed_batches(val_examples, collate),
        test_rows=test_rows,
    )


def examples(config, model, tokenizer, labels, rows: list[tuple[str, str]]) -> list[Example]:
    """Texts as the model reads them (long ones keep their head and tail), with the index
    of their label; rows of a label the model does not know are left out."""
    index = {label: i for i, label in enumerate(labels)}
    rows = [r for r in rows if r[1] in index]
    ids = classifier_inputs(model, tokenizer, [t for t, _ in rows], config.max_len)
    return [(i, index[y]) for i, (_, y) in zip(ids, rows, strict=True)]


def collate_labelled(batch: list[Example], pad_id: int):
    from glassformer.data.batching import collate_labelled as collate

    return collate([i for i, _ in batch], [y for _, y in batch], pad_id)


def fixed_batches(items: list[Example], collate) -> list:
    """Batches of 64 texts of similar length, the same at every evaluation."""
    from glassformer.data.batching import BucketBatches

    return [collate(b) for b in BucketBatches(items, 64, key=_length, shuffle=False, seed=0)]


def _length(example: Example) -> int:
    return len(example[0])


@dataclass(kw_only=True)
class ClassifyTask(Task):
    """A classifier of texts."""

    name = "classify"
    unit = "ex"
    tokenizer: Tokenizer
    labels: list[str]
    val_rows: list[tuple[str, str]]
    val_batches: list
    test_rows: list[tuple[str, str]]

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        return score(model, self.val_batches, prefix="val_")

    def test(self, model: nn.Module) -> dict[str, float]:
        """Accuracy on the test split (or validation, if the data has none)."""
        prefix = "test_" if self.test_rows else "val_"
        rows = self.test_rows or self.val_rows
        held_out = examples(self.config, model, self.tokenizer, self.labels, rows)
        collate = partial(collate_labelled, pad_id=self.tokenizer.pad_id)
        figures = score(model, fixed_batches(held_out, collate), prefix=prefix)
        return {**figures, f"{prefix}examples": len(held_out)}

    def show(self, model: nn.Module) -> str:
        """A few validation texts, their labels and the model's verdicts."""
        rows = self.val_rows[:SHOWN]
        verdicts = classify_texts(
            model, self.tokenizer, self.labels, [t for t, _ in rows], max_len=self.config.max_len
        )
        lines = []
        for (text, gold), (pred, p) in zip(rows, verdicts, strict=True):
            snippet = text[:90].replace("\n", " ") + ("..." if len(text) > 90 else "")
            mark = "ok" if pred == gold else "WRONG"
            lines.append(f"[{mark:>5}] {pred} ({p:.2f}) vs {gold}: {snippet}")
        return "\n".join(lines)


# The parts of a model that a classifier's backbone is (the same modules, the same names
# in every model kind), and the kinds of model a classifier can start from.
ENCODER_PARTS = ("embed", "pos_embed", "token_type", "ln_embed", "blocks", "ln_final")
ENCODER_KINDS = ("encoder_lm", "bert", "sentence", "gpt")


def load_pretrained_encoder(
    init: str, max_len: int, model_overrides: dict[str, Any]
) -> tuple[Any, Any]:
    """(model, tokenizer) of what ``--init`` names, checked to be one a classifier can start
    from: a ``glassformer train mlm`` or ``lm`` run (or its checkpoint directory), another
    GPT, all-MiniLM-L6-v2, a sentence-transformers directory or a Hugging Face BERT
    directory."""
    from glassformer.inference import load_run

    if model_overrides:
        raise ValueError(
            f"--init {init} gives the model's shape; leave out "
            f"{', '.join('--' + k.replace('_', '-') for k in sorted(model_overrides))}"
        )
    model, tokenizer = load_run(init)
    kind = getattr(model, "kind", type(model).__name__)
    if kind not in ENCODER_KINDS:
        raise ValueError(
            f"--init {init} holds a {kind!r} model; a classifier starts from a pretrained "
            "encoder or decoder: an mlm or lm run, all-MiniLM-L6-v2, a BERT directory"
        )
    if max_len > model.config.max_len:
        raise ValueError(
            f"--max-len {max_len} is longer than --init {init} reads ({model.config.max_len})"
        )
    return model, tokenizer


def classifier_from_encoder(source: Any, num_classes: int, *, linear_probe: bool = False) -> Any:
    """A classifier whose embeddings and encoder are ``source``'s (copied; its head is new):
    a ``TransformerClassifier`` for glassformer's encoder LM, a ``GPTClassifier`` (the last
    real token's state) for a GPT, a ``BertClassifier`` (mean pooling) for a BERT-style
    encoder. ``linear_probe`` freezes what was copied."""
    model: Any
    if source.kind == "encoder_lm":
        shared = {f.name: getattr(source.config, f.name) for f in dataclasses.fields(ModelConfig)}
        config = ClassifierConfig(
            vocab_size=source.config.vocab_size,
            num_classes=num_classes,
            num_layers=source.config.num_layers,
            **shared,
        )
        model = TransformerClassifier(config)
    elif source.kind == "gpt":  # the causal blocks, and a head on the last real token
        if isinstance(source.config, GPTConfig):
            gpt = {f.name: getattr(source.config, f.name) for f in dataclasses.fields(GPTConfig)}
            causal = GPTClassifierConfig(**gpt, num_classes=num_classes)
        else:  # a pretrained family's blocks (SmolLM2's)
            causal = GPTClassifierConfig.from_family(source.config, num_classes=num_classes)
        model = GPTClassifier(causal)
    else:  # bert, sentence: BertConfig's fields are the encoder's shape
        bert = {f.name: getattr(source.config, f.name) for f in dataclasses.fields(BertConfig)}
        bert.pop("pooler")
        model = BertClassifier(BertClassifierConfig(**bert, num_classes=num_classes))
    missing, unexpected = model.load_state_dict(source.backbone_state_dict(), strict=False)
    if unexpected or any(not name.startswith("head.") for name in missing):
        raise ValueError(f"the backbones differ: missing {missing}, unexpected {unexpected}")
    for part in ENCODER_PARTS:
        if getattr(model, part, None) is not None:
            getattr(model, part).requires_grad_(not linear_probe)
    return model


def _check_labels(
    config: RunConfig, rows: list[tuple[str, str]], labels: list[str], resumed: bool
) -> None:
    """Every label in ``rows`` must be one the classifier was (or is being) trained on."""
    unseen = sorted({label for _, label in rows} - set(labels))
    if not unseen:
        return
    source = config.data or f"corpus {config.corpus!r}"
    names = ", ".join(repr(label) for label in unseen)
    which = f"label {names}" if len(unseen) == 1 else f"labels {names}"
    where = (
        "was not seen in training" if resumed else "is only in the held-out rows, never in training"
    )
    if len(unseen) > 1:
        where = where.replace("was ", "were ").replace("is only", "are only")
    raise ValueError(f"{source}: {which} {where} (known: {', '.join(labels)})")
