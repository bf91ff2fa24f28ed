"""Checkpoints: round trips, tied weights, clear errors, atomic replacement, safe loading."""

import json
import os
import pickle
import time

import pytest
import torch
from safetensors import safe_open

from glassformer import (
    GPT,
    ClassifierConfig,
    EncoderLM,
    EncoderLMConfig,
    GPTConfig,
    Seq2SeqConfig,
    Seq2SeqTransformer,
    TransformerClassifier,
    load_checkpoint,
    save_checkpoint,
)
from glassformer.checkpoint import CheckpointError, load_training_state

# kind: (factory of a small model with non-default settings, call(model, ids) -> logits)
MODELS = {
    "classifier": (
        lambda: TransformerClassifier(
            ClassifierConfig.preset(
                "tiny",
                vocab_size=30,
                num_classes=3,
                pooling="max",
                positional="sinusoidal",
                norm_first=True,
                activation="gelu",
                head_dim=32,
            )
        ),
        lambda m, ids: m(ids).logits,
    ),
    "seq2seq": (
        lambda: Seq2SeqTransformer(
            Seq2SeqConfig.preset(
                "tiny", src_vocab_size=30, tgt_vocab_size=30, share_embeddings=True, tie_output=True
            )
        ),
        lambda m, ids: m(ids, ids[:, :5]).logits,
    ),
    "gpt": (
        lambda: GPT(GPTConfig.preset("tiny", vocab_size=30, num_layers=2)),
        lambda m, ids: m(ids).logits,
    ),
    "encoder_lm": (
        lambda: EncoderLM(EncoderLMConfig.preset("tiny", vocab_size=30, tie_weights=True)),
        lambda m, ids: m(ids).logits,
    ),
}
IDS = torch.tensor([[4, 5, 6, 7, 8, 9], [4, 5, 6, 7, 0, 0]])


def make(kind, seed=0):
    """A model whose every parameter (LayerNorms and biases too) is off its initial value,
    so a weight that failed to load could not pass by matching a fresh model's init."""
    torch.manual_seed(seed)
    model = MODELS[kind][0]()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def gpt_checkpoint(path):
    make("gpt").save_pretrained(path)
    return path


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_round_trip_gives_identical_outputs(kind, tmp_path):
    model = make(kind)
    call = MODELS[kind][1]
    assert model.save_pretrained(tmp_path / "ckpt") == tmp_path / "ckpt"
    loaded = type(model).from_pretrained(tmp_path / "ckpt")
    assert type(loaded) is type(model)
    assert loaded.config == model.config
    assert not loaded.training
    assert torch.equal(call(loaded, IDS), call(model, IDS))
    state, loaded_state = model.state_dict(), loaded.state_dict()
    assert state.keys() == loaded_state.keys()
    for name, tensor in state.items():
        assert torch.equal(loaded_state[name], tensor), name
    # the kind-agnostic loader gives the same model
    assert torch.equal(call(load_checkpoint(tmp_path / "ckpt"), IDS), call(model, IDS))
    meta = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert meta["kind"] == kind
    assert meta["config"] == model.config.to_dict()


@pytest.mark.parametrize(
    "kind, tied",
    [
        ("seq2seq", ["output_proj.weight", "decoder.embed.weight"]),
        ("gpt", ["lm_head.weight"]),
        ("encoder_lm", ["lm_head.weight"]),
    ],
)
def test_tied_weights_stay_tied_after_loading_and_are_stored_once(kind, tied, tmp_path):
    model = make(kind)
    model.save_pretrained(tmp_path / "m")
    loaded = load_checkpoint(tmp_path / "m")
    params = dict(loaded.named_parameters(remove_duplicate=False))
    embedding = params["encoder.embed.weight" if kind == "seq2seq" else "embed.weight"]
    for name in tied:
        assert params[name] is embedding, name
    assert loaded.num_parameters() == model.num_parameters()
    # still tied after an optimiser step, not two copies that happened to match
    with torch.no_grad():
        embedding.mul_(2.0)
    for name in tied:
        assert torch.equal(params[name], embedding)
    with safe_open(str(tmp_path / "m" / "model.safetensors"), "pt") as f:
        stored = set(f.keys())
    assert len(stored) == len(model.state_dict()) - len(tied)


def test_seq2seq_with_only_shared_embeddings_keeps_its_own_output_matrix(tmp_path):
    torch.manual_seed(0)
    model = Seq2SeqTransformer(
        Seq2SeqConfig.preset("tiny", src_vocab_size=30, tgt_vocab_size=30, share_embeddings=True)
    )
    model.save_pretrained(tmp_path / "s")
    loaded = Seq2SeqTransformer.from_pretrained(tmp_path / "s")
    src = loaded.encoder.embed.weight
    assert loaded.decoder.embed.weight is src
    assert loaded.output_proj.weight is not src
    assert torch.equal(loaded.output_proj.weight, model.output_proj.weight)


def test_a_compiled_model_saves_the_same_keys(tmp_path):
    model = make("gpt")
    compiled = torch.compile(model)  # not run: wrapping alone is what adds the prefix
    save_checkpoint(compiled, tmp_path / "c")
    assert torch.equal(load_checkpoint(tmp_path / "c").lm_head.weight, model.lm_head.weight)


# ---- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "saved, expected",
    [
        ("gpt", "classifier"),
        ("classifier", "seq2seq"),
        ("seq2seq", "encoder_lm"),
        ("encoder_lm", "gpt"),
    ],
)
def test_wrong_kind_names_both(saved, expected, tmp_path):
    make(saved).save_pretrained(tmp_path / "m")
    message = f"holds a '{saved}' model, expected '{expected}'"
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(tmp_path / "m", kind=expected)
    cls = {"gpt": GPT, "classifier": TransformerClassifier, "seq2seq": Seq2SeqTransformer}
    cls["encoder_lm"] = EncoderLM
    with pytest.raises(CheckpointError, match=message):
        cls[expected].from_pretrained(tmp_path / "m")


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="nowhere does not exist"):
        load_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        CheckpointError, match="empty is not a glassformer checkpoint: no config.json"
    ):
        load_checkpoint(tmp_path / "empty")
    (tmp_path / "file.txt").write_text("hello")
    with pytest.raises(CheckpointError, match="no config.json"):
        load_checkpoint(tmp_path / "file.txt")


def test_missing_weights(tmp_path):
    gpt_checkpoint(tmp_path / "g")
    (tmp_path / "g" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="has no model.safetensors"):
        GPT.from_pretrained(tmp_path / "g")


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "",
        "[1, 2]",
        "null",
        '{"kind": "gpt"}',
        '{"config": {"vocab_size": 30}}',
        '{"kind": "transformer-xl", "config": {}}',
        '{"kind": "gpt", "config": {}}',
        '{"kind": "gpt", "config": null}',
        '{"kind": "gpt", "config": {"vocab_size": -5}}',
        '{"kind": "gpt", "config": {"vocab_size": 30, "n_embd": 4}}',
        '{"kind": ["gpt"], "config": {}}',
    ],
)
def test_a_garbage_config_is_a_checkpoint_error_naming_the_file(text, tmp_path):
    gpt_checkpoint(tmp_path / "g")
    (tmp_path / "g" / "config.json").write_text(text)
    with pytest.raises(CheckpointError, match=r"g[/\\]config\.json|g holds unknown model kind"):
        load_checkpoint(tmp_path / "g")


def test_a_config_that_is_not_text_is_a_checkpoint_error(tmp_path):
    gpt_checkpoint(tmp_path / "g")
    (tmp_path / "g" / "config.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(CheckpointError, match="is not a glassformer config"):
        load_checkpoint(tmp_path / "g")


@pytest.mark.parametrize("keep", [0, 7, 100, 0.5, -1], ids=lambda k: f"keep={k}")
def test_truncated_weights_are_a_checkpoint_error(keep, tmp_path):
    weights = gpt_checkpoint(tmp_path / "g") / "model.safetensors"
    data = weights.read_bytes()
    n = int(len(data) * keep) if isinstance(keep, float) else keep % len(data)
    weights.write_bytes(data[:n])
    with pytest.raises(CheckpointError, match=r"cannot load .*model\.safetensors: .+"):
        load_checkpoint(tmp_path / "g")


def test_weights_from_another_config_are_refused(tmp_path):
    gpt_checkpoint(tmp_path / "g")
    meta = json.loads((tmp_path / "g" / "config.json").read_text())
    meta["config"]["num_layers"] = 3
    (tmp_path / "g" / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="missing .*blocks.2"):
        load_checkpoint(tmp_path / "g")
    meta["config"]["num_layers"], meta["config"]["vocab_size"] = 2, 31
    (tmp_path / "g" / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="cannot load"):
        load_checkpoint(tmp_path / "g")


# ---- atomic replacement ------------------------------------------------------------------


def test_saving_over_a_checkpoint_replaces_it_and_leaves_no_temporaries(tmp_path):
    first, second = make("gpt", seed=1), make("classifier", seed=2)
    save_checkpoint(
        first,
        tmp_path / "ckpt",
        training_state={"step": torch.tensor(3)},
        extra_files={"tokenizer.json": b"{}"},
    )
    assert (tmp_path / "ckpt" / "training_state.pt").is_file()
    second.save_pretrained(tmp_path / "ckpt")
    loaded = load_checkpoint(tmp_path / "ckpt")
    assert isinstance(loaded, TransformerClassifier)
    assert torch.equal(loaded(IDS).logits, second(IDS).logits)
    # a replacement, not a merge: nothing of the first checkpoint is left
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["config.json", "model.safetensors"]
    assert [name for name in os.listdir(tmp_path) if name.startswith(".")] == []
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    gpt_checkpoint(tmp_path / "ckpt")
    before = (tmp_path / "ckpt" / "model.safetensors").read_bytes()

    def boom(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr("glassformer.checkpoint.save_model", boom)
    with pytest.raises(OSError, match="No space left"):
        make("gpt", seed=5).save_pretrained(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


# ---- training state and run directories ---------------------------------------------------


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_training_state_with_code_in_it_is_refused(tmp_path):
    save_checkpoint(make("gpt"), tmp_path / "ckpt", training_state={"step": torch.tensor(3)})
    assert load_training_state(tmp_path / "ckpt")["step"].item() == 3
    with open(tmp_path / "ckpt" / "training_state.pt", "wb") as f:
        pickle.dump({"evil": _Exploit()}, f)
    with pytest.raises(CheckpointError, match="cannot load"):
        load_training_state(tmp_path / "ckpt")


def test_a_run_directory_resolves_to_its_checkpoint(tmp_path):
    model = make("gpt")
    model.save_pretrained(tmp_path / "run" / "checkpoint")
    loaded = load_checkpoint(tmp_path / "run")
    assert isinstance(loaded, GPT)
    assert torch.equal(loaded(IDS).logits, model(IDS).logits)


# ---- reliability: full disks, crashes between renames, code in pickles --------------------


def _files(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_a_full_disk_mid_save_is_one_clear_error_and_changes_nothing(tmp_path, monkeypatch):
    import errno
    from pathlib import Path

    from glassformer.checkpoint import CheckpointSaveError

    ckpt = tmp_path / "ckpt"
    save_checkpoint(make("gpt"), ckpt, training_state={"step": torch.tensor(1)})
    before = _files(ckpt)
    real_write_bytes = Path.write_bytes

    def half_then_full(self, data):  # the disk fills up halfway through training_state.pt
        if self.name == "training_state.pt":
            real_write_bytes(self, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real_write_bytes(self, data)

    monkeypatch.setattr(Path, "write_bytes", half_then_full)
    with pytest.raises(CheckpointSaveError) as e:
        save_checkpoint(make("gpt", seed=3), ckpt, training_state={"step": torch.tensor(2)})
    assert str(e.value) == (
        f"no space left on device while saving checkpoint to {ckpt}; "
        "the previous checkpoint there is intact"
    )
    assert e.value.errno == errno.ENOSPC and isinstance(e.value, OSError)
    monkeypatch.undo()
    assert _files(ckpt) == before
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # no temporaries left behind


def test_the_libraries_full_disk_errors_become_the_same_message(tmp_path, monkeypatch):
    """safetensors reports ENOSPC as its own error type with "(os error 28)" in the text."""
    from glassformer.checkpoint import CheckpointSaveError

    class SafetensorError(Exception):
        pass

    def full(model, filename, **kwargs):
        with open(filename, "wb") as f:
            f.write(b"\0" * 100)
        raise SafetensorError("Error while serializing: I/O error: No space left (os error 28)")

    monkeypatch.setattr("glassformer.checkpoint.save_model", full)
    with pytest.raises(CheckpointSaveError, match=r"^no space left on device while saving"):
        save_checkpoint(make("gpt"), tmp_path / "new")
    assert os.listdir(tmp_path) == []


def test_a_crash_between_the_two_renames_keeps_the_previous_checkpoint(tmp_path):
    """Replacing a checkpoint renames the old one to .NAME.old, then the new one into place;
    a kill between the two leaves no NAME. Loading reads .NAME.old; the next save restores
    it first and clears what the killed save left."""
    first, second, third = make("gpt", seed=1), make("gpt", seed=2), make("gpt", seed=3)
    run = tmp_path / "run"
    save_checkpoint(first, run / "checkpoint", training_state={"step": torch.tensor(1)})
    save_checkpoint(second, tmp_path / "staged")
    os.replace(run / "checkpoint", run / ".checkpoint.old")  # the first rename...
    os.replace(tmp_path / "staged", run / ".checkpoint.partial-k1ll3d_0")  # ...a temporary
    for path in (run / "checkpoint", run):
        assert torch.equal(load_checkpoint(path)(IDS).logits, first(IDS).logits)
    assert load_training_state(run)["step"].item() == 1
    save_checkpoint(third, run / "checkpoint")
    assert torch.equal(load_checkpoint(run)(IDS).logits, third(IDS).logits)
    assert sorted(os.listdir(run)) == ["checkpoint"]


class _Toucher:
    """Unpickling this runs `touch MARKER`: what a malicious checkpoint would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("writer", ["pickle", "torch.save"])
def test_a_malicious_training_state_is_refused_and_runs_nothing(writer, tmp_path):
    ckpt = tmp_path / "ckpt"
    save_checkpoint(make("gpt"), ckpt, training_state={"step": torch.tensor(3)})
    marker = tmp_path / "pwned"
    payload = {"step": torch.tensor(3), "evil": _Toucher(marker)}
    file = ckpt / "training_state.pt"
    if writer == "pickle":
        file.write_bytes(pickle.dumps(payload))
    else:
        torch.save(payload, file)
    # (test_the_malicious_file_would_run_code_without_weights_only shows the payload is live)
    with pytest.raises(CheckpointError) as e:
        load_training_state(ckpt)
    assert str(e.value).startswith(f"cannot load {file}: refused: ") and "\n" not in str(e.value)
    if writer == "torch.save":
        assert f"unpickling it would call {os.system.__module__}.system" in str(e.value)
    assert not marker.exists()


def test_a_malicious_pytorch_model_bin_is_refused_and_runs_nothing(tmp_path):
    from glassformer.interop import save_gpt2

    hf = tmp_path / "gpt2"
    save_gpt2(make("gpt"), hf)
    marker = tmp_path / "pwned"
    (hf / "model.safetensors").unlink()
    torch.save({"wte.weight": _Toucher(marker)}, hf / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"cannot load .*pytorch_model\.bin: "):
        GPT.from_pretrained(hf)
    with pytest.raises(CheckpointError, match=r"cannot load .*pytorch_model\.bin: "):
        load_checkpoint(hf)
    assert not marker.exists()


def test_the_malicious_file_would_run_code_without_weights_only(tmp_path):
    """The control: the same payload does run when unpickled the unsafe way, so the tests
    above prove a refusal, not a harmless file."""
    marker = tmp_path / "ran"
    torch.save({"evil": _Toucher(marker)}, tmp_path / "state.pt")
    torch.load(tmp_path / "state.pt", weights_only=False)
    assert marker.exists()


# ---- hostile files (issue 49) -------------------------------------------------------------


def test_a_save_named_like_a_pattern_deletes_nothing_beside_it(tmp_path):
    """`--out 'runs/*'` once deleted an unrelated hidden folder beside it: the save's own
    name was used as a glob pattern to find its leftovers."""
    runs = tmp_path / "runs"
    for name in (".cache.d", ".git.x", ".*.settings"):
        (runs / name).mkdir(parents=True)
        (runs / name / "keep.txt").write_text("mine")
    for _ in range(2):  # the second save looks for leftovers of the first
        save_checkpoint(make("gpt"), runs / "*")
    assert sorted(os.listdir(runs)) == ["*", ".*.settings", ".cache.d", ".git.x"]
    for name in (".cache.d", ".git.x", ".*.settings"):
        assert (runs / name / "keep.txt").read_text() == "mine"


def test_a_checkpoint_follows_the_umask(tmp_path):
    before = os.umask(0o022)
    try:
        make("gpt").save_pretrained(tmp_path / "ckpt")
    finally:
        os.umask(before)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "ckpt").iterdir()}
    assert modes == {"config.json": 0o644, "model.safetensors": 0o644}
    assert (tmp_path / "ckpt").stat().st_mode & 0o777 == 0o755


def _with_config(path, **changes):
    """A small sinusoidal GPT's checkpoint whose config.json then says ``changes``."""
    GPT(
        GPTConfig.preset("tiny", vocab_size=30, num_layers=2, positional="sinusoidal")
    ).save_pretrained(path)
    meta = json.loads((path / "config.json").read_text())
    meta["config"].update(changes)
    (path / "config.json").write_text(json.dumps(meta))
    return path


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_layers", 5_000),  # under the configs' own ceiling; a list of 5000 blocks
        ("vocab_size", 10**12),  # an embedding of 10^12 rows
        ("d_ff", 10**12),
        ("d_model", 2**40),
        ("max_len", 10**12),  # the sinusoidal table is not stored: it is computed
    ],
)
def test_a_config_bigger_than_its_weights_is_refused_before_anything_is_built(
    field, value, tmp_path
):
    path = _with_config(tmp_path / "g", **{field: value})
    started = time.perf_counter()
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    message = str(e.value)
    assert "\n" not in message and "config.json" in message, message
    assert f"{field} {value}" in message or f"{field} is {value}" in message, message
    assert time.perf_counter() - started < 5  # nothing was built (5000 blocks take far longer)


def test_a_deeply_nested_config_is_one_line(tmp_path):
    path = gpt_checkpoint(tmp_path / "g")
    (path / "config.json").write_text(
        '{"kind": "gpt", "config": ' + "[" * 100_000 + "]" * 100_000 + "}"
    )
    with pytest.raises(CheckpointError, match=r"config\.json is not a glassformer config: nested"):
        load_checkpoint(path)


LONG = "x" * 100_000  # a value no message should echo whole


def _long_safetensors_header(path):
    """model.safetensors whose header names a 100,000-character dtype (safetensors' own
    error quotes it whole)."""
    import struct

    header = json.dumps({"w": {"dtype": LONG, "shape": [1], "data_offsets": [0, 4]}}).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))


@pytest.mark.parametrize(
    "meta, config, weights, says",
    [
        ({"kind": LONG, "config": {}}, None, None, ("kind 'xxx", "xxx' (100,000 characters);")),
        ({"model_type": LONG}, None, None, ("Face 'xxx", "xxx' (100,000 characters) checkpoint")),
        (
            {"model_type": [LONG]},
            None,
            None,
            ("Face ['xxx", "xxx'] (100,004 characters) checkpoint"),
        ),
        (
            None,
            {"num_layers": LONG},
            None,
            ("num_layers must be a positive integer, got 'xxx", "xxx' (100,000 characters)"),
        ),
        (
            None,
            {"vocab_size": 10**4000},
            None,
            ("vocab_size is 1000", "000 (4,001 characters), but"),
        ),
        (None, {LONG: 1}, None, ("has no field(s) ['xxx", "xxx'] (100,004 characters)")),
        (None, None, _long_safetensors_header, ("unknown variant `xxx",)),
    ],
    ids=["kind", "model-type", "model-type-list", "num-layers", "vocab-size", "field", "header"],
)
def test_a_long_value_is_cut_in_the_one_line_naming_the_file(meta, config, weights, says, tmp_path):
    """A 100,000-character value in config.json (``meta`` in place of it, or ``config``
    changed in it) or in the safetensors header was echoed whole (found by the fuzzer:
    tests/data/fuzz/corpus/directory/model-type-echoed-whole)."""
    path = _with_config(tmp_path / "g", **(config or {}))
    if meta is not None:
        (path / "config.json").write_text(json.dumps(meta))
    if weights is not None:
        weights(path)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    message = str(e.value)
    assert "\n" not in message and len(message) < 1000, message[:2000]
    assert str(path) in message and all(needle in message for needle in says), message
