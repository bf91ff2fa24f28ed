"""What every Hugging Face directory reader shares (glassformer.interop._hf, ._fields):
huggingface_hub's cache layout opens while every other path out of a directory is refused,
the shard index and config.json are read within bounds, each config field is held against
what the readers expect before any of them uses it, and every failure is one line naming
the path the user gave.

Directories are tiny random transformers models, saved by transformers itself.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from hf_families import IDS, SMALL_DECODER, with_config

from glassformer import GPT
from glassformer.checkpoint import CheckpointError
from glassformer.interop import _hf, load_llama, read_saelens
from glassformer.interop._hf import build_config
from glassformer.models.families import LlamaConfig

transformers = pytest.importorskip("transformers")
hub = pytest.importorskip("huggingface_hub")

REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """Tiny directories of four families, as transformers saves them (one Llama sharded)."""
    root = tmp_path_factory.mktemp("hf")
    decoder = {k: v for k, v in SMALL_DECODER.items() if k != "attn_implementation"}
    models = {
        "llama": transformers.LlamaForCausalLM(transformers.LlamaConfig(**decoder)),
        "gemma3": transformers.Gemma3ForCausalLM(
            transformers.Gemma3TextConfig(**decoder, head_dim=8, sliding_window=4)
        ),
        "gpt_neox": transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**decoder)),
        "gpt2": transformers.GPT2LMHeadModel(
            transformers.GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=64)
        ),
    }
    torch.manual_seed(0)
    paths = {}
    for name, model in models.items():
        paths[name] = root / name
        model.save_pretrained(paths[name])
    paths["sharded"] = root / "sharded"
    models["llama"].save_pretrained(paths["sharded"], max_shard_size="20KB")
    return paths


def _copy(saved: dict[str, Path], name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(saved[name], tmp_path / name))


# ---- huggingface_hub's cache: snapshots link into their own repository's blobs ---------------


def hub_cache(cache: Path, repo_id: str, files: Path) -> Path:
    """The files of ``files`` laid out as huggingface_hub lays out a downloaded repository
    (``models--org--name/{blobs,refs,snapshots}``: each file's bytes in ``blobs/`` under its
    hash, ``refs/main`` naming the revision, ``snapshots/<revision>/`` holding relative
    symbolic links to the blobs); the snapshot."""
    repository = cache / ("models--" + repo_id.replace("/", "--"))
    (repository / "blobs").mkdir(parents=True)
    (repository / "refs").mkdir()
    (repository / "refs" / "main").write_text(REVISION)
    snapshot = repository / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    for file in sorted(files.iterdir()):
        data = file.read_bytes()
        blob = hashlib.sha256(data).hexdigest()
        (repository / "blobs" / blob).write_bytes(data)
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", blob))
    return snapshot


def test_a_sharded_model_in_the_hub_cache_loads_as_its_directory_does(saved, tmp_path):
    cache = tmp_path / "hub"
    snapshot = hub_cache(cache, "org/tiny-llama", saved["sharded"])
    found = hub.try_to_load_from_cache("org/tiny-llama", "config.json", cache_dir=cache)
    assert found == str(snapshot / "config.json")  # the layout huggingface_hub itself reads
    shards = [p for p in snapshot.iterdir() if p.name.startswith("model-")]
    assert len(shards) > 1 and all(p.is_symlink() for p in shards)
    with torch.no_grad():
        expected = GPT.from_pretrained(saved["sharded"])(IDS).logits
        got = GPT.from_pretrained(snapshot)(IDS).logits
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


def _relink(link: Path, target: Path) -> None:
    link.unlink()
    link.symlink_to(target)


@pytest.mark.parametrize("escape", ["elsewhere", "another repository", "dotdot", "absolute"])
def test_every_other_way_out_of_a_snapshot_is_refused(saved, tmp_path, escape):
    """A shard linked to a file elsewhere or into another repository's blobs (the same
    bytes), or named by the index with ``..`` (even into its own blobs) or absolutely."""
    snapshot = hub_cache(tmp_path / "hub", "org/tiny-llama", saved["sharded"])
    other = hub_cache(tmp_path / "hub", "org/other", saved["sharded"])
    index = snapshot / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    shard = sorted(set(data["weight_map"].values()))[0]
    blob = (snapshot / shard).resolve()
    if escape == "elsewhere":
        (tmp_path / "elsewhere").mkdir()
        _relink(snapshot / shard, Path(shutil.copy(blob, tmp_path / "elsewhere" / shard)))
    elif escape == "another repository":
        _relink(snapshot / shard, Path("../../../models--org--other/blobs", blob.name))
        assert (snapshot / shard).resolve() == (other / shard).resolve()
    else:
        name = f"../../blobs/{blob.name}" if escape == "dotdot" else str(blob)
        data["weight_map"] = {k: name if v == shard else v for k, v in data["weight_map"].items()}
        index.unlink()
        index.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="names a shard outside its directory") as e:
        GPT.from_pretrained(snapshot)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("layout", ["hub cache", "elsewhere"])
def test_a_single_weights_file_is_read_from_the_directory_or_its_hub_blobs(saved, tmp_path, layout):
    """One ``model.safetensors``: a link into its own repository's blobs loads; a link to a
    file outside the directory (the same bytes) is refused."""
    snapshot = hub_cache(tmp_path / "hub", "org/tiny-llama", saved["llama"])
    if layout == "elsewhere":
        (tmp_path / "elsewhere").mkdir()
        blob = (snapshot / "model.safetensors").resolve()
        copy = shutil.copy(blob, tmp_path / "elsewhere" / "model.safetensors")
        _relink(snapshot / "model.safetensors", Path(copy))
        with pytest.raises(CheckpointError, match="names a weights file outside its directory"):
            GPT.from_pretrained(snapshot)
        return
    with torch.no_grad():
        expected = GPT.from_pretrained(saved["llama"])(IDS).logits
        got = GPT.from_pretrained(snapshot)(IDS).logits
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


@pytest.mark.parametrize(
    "index, message",
    [
        ("[" * 100_000 + "]" * 100_000, "is not a readable shard index: it is nested too deeply"),
        ('{"weight_map": ["model.safetensors"]}', "expected a weight_map of tensor names"),
        ('{"weight_map": {"a": 1}}', "expected a weight_map of tensor names"),
        (" " * 300_000 + "{}", "is not a readable shard index: it is larger than 250,000"),
        ('{"weight_map": {"a": "x", "b": "y", "c": "z"}}', "names 3 shards; at most 2"),
    ],
)
def test_the_shard_index_is_read_within_bounds(saved, tmp_path, monkeypatch, index, message):
    monkeypatch.setattr(_hf, "MAX_INDEX_BYTES", 250_000)
    monkeypatch.setattr(_hf, "MAX_SHARDS", 2)
    path = _copy(saved, "sharded", tmp_path)
    (path / "model.safetensors.index.json").write_text(index)
    with pytest.raises(CheckpointError, match=message) as e:
        GPT.from_pretrained(path)
    assert "\n" not in str(e.value)


# ---- config.json: every field held against what the readers expect --------------------------

INF, NAN = math.inf, math.nan
CASES = [  # (family, fields changed, the field and value the error names, what it expects)
    ("llama", dict(num_attention_heads=0), "num_attention_heads is 0", "an integer in"),
    ("llama", dict(rope_scaling=[1, 2]), r"rope_scaling is \[1, 2\]", "a JSON object"),
    ("llama", dict(rope_scaling="linear"), "rope_scaling is 'linear'", "a JSON object"),
    ("llama", dict(rope_parameters=[1]), r"rope_parameters is \[1\]", "a JSON object"),
    ("llama", dict(hidden_size=-32), "hidden_size is -32", "an integer in"),
    ("llama", dict(rms_norm_eps=INF), "rms_norm_eps is Infinity", r"in \[0, 1\]"),
    ("llama", dict(rope_theta=NAN), "rope_theta is NaN", "a finite number > 0"),
    ("llama", dict(num_hidden_layers=4_000_000_000), "num_hidden_layers is 4000000000", "10000"),
    ("llama", dict(hidden_act=["silu"]), r"hidden_act is \['silu'\]", "a string"),
    ("gemma3", dict(sliding_window_pattern=0, layer_types=None), "sliding_window_pattern is 0",
     "an integer in"),
    ("gemma3", dict(query_pre_attn_scalar=0), "query_pre_attn_scalar is 0", "a finite number > 0"),
    ("gemma3", dict(rope_parameters={"full_attention": [1]}),
     r"rope_parameters.full_attention is \[1\]", "a JSON object"),
    ("gemma3", dict(num_hidden_layers=4_000_000_000, layer_types=None),
     "num_hidden_layers is 4000000000", "an integer in"),
    ("gpt_neox", dict(rotary_pct=INF, rope_parameters=None), "rotary_pct is Infinity",
     r"in \(0, 1\]"),
    ("gpt_neox", dict(rope_parameters={"partial_rotary_factor": NAN}),
     "rope_parameters.partial_rotary_factor is NaN", r"in \(0, 1\]"),
    ("gpt_neox", dict(num_attention_heads=5), "hidden_size is 32", "a multiple of "
     r"num_attention_heads \(5\)"),
    ("gpt2", dict(n_head=5), "n_embd is 32", r"a multiple of n_head \(5\)"),
    ("gpt2", dict(n_layer=-1), "n_layer is -1", "an integer in"),
    ("gpt2", dict(vocab_size=10**11), "vocab_size is 100000000000", "an integer in"),
]  # fmt: skip


@pytest.mark.parametrize("family, changes, named, expected", CASES)
def test_a_config_value_no_reader_expects_is_one_line(saved, tmp_path, family, changes, named,
                                                      expected):  # fmt: skip
    """The line names config.json, the field, its value (as JSON writes it) and what it
    must be; a billion layers is refused before a list of them is built."""
    path = _copy(saved, family, tmp_path)
    with_config(path, **changes)
    with pytest.raises(CheckpointError) as e:
        GPT.from_pretrained(path)
    message = str(e.value)
    assert message.startswith(f"{path / 'config.json'}: ") and "\n" not in message
    assert re.search(named, message) and re.search(expected, message), message


def test_a_config_nested_past_what_python_parses_is_one_line(saved, tmp_path):
    path = _copy(saved, "llama", tmp_path)
    deep = "[" * 100_000 + "]" * 100_000
    (path / "config.json").write_text('{"model_type": "llama", "x": ' + deep + "}")
    with pytest.raises(CheckpointError, match="is not a readable config: it is nested too deeply"):
        load_llama(path)


# ---- errors name the path the user gave ------------------------------------------------------


def test_a_file_where_a_directory_is_expected_is_named_as_given(tmp_path):
    """Not ``x.gguf/config.json``, which reading inside the file would name."""
    file = tmp_path / "x.gguf"
    file.write_bytes(b"GGUF")
    for read in (load_llama, read_saelens):
        with pytest.raises(CheckpointError) as e:
            read(file)
        assert str(e.value).startswith(f"{file} is not a directory") and "x.gguf/" not in str(
            e.value
        )
        with pytest.raises(CheckpointError, match=f"^{tmp_path / 'missing'} does not exist$"):
            read(tmp_path / "missing")


def test_a_config_read_from_a_file_names_that_file(tmp_path):
    """A GGUF file's metadata is its config: an error in it names the file, not a
    config.json beside or inside it."""
    hf = {"model_type": "llama", **SMALL_DECODER, "num_attention_heads": 0}
    with pytest.raises(CheckpointError) as e:
        build_config(LlamaConfig.from_hf, hf, tmp_path / "model.gguf")
    assert str(e.value).startswith(f"{tmp_path / 'model.gguf'}: num_attention_heads is 0")


def test_weights_that_disagree_are_one_line_naming_the_directory(saved, tmp_path):
    """A missing tensor, and q and k projections of different widths (torch.cat's
    RuntimeError before), each name the directory."""
    from safetensors.torch import load_file, save_file

    path = _copy(saved, "llama", tmp_path)
    file = path / "model.safetensors"
    tensors = load_file(file)
    name = "model.layers.1.self_attn.k_proj.weight"
    tensors[name] = tensors[name][:, :31].contiguous()
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as e:
        GPT.from_pretrained(path)
    assert str(e.value).startswith(f"{path}: the weights do not fit the config: ")
    assert "\n" not in str(e.value)
    del tensors[name]
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as e:
        GPT.from_pretrained(path)
    assert str(e.value) == f"{path}: Llama weights have no 'layers.1.self_attn.k_proj.weight'"


# ---- a long value is cut in the line, not echoed whole ----------------------------------------

LONG = "x" * 100_000


def _long_dtype(path: Path) -> str:
    """model.safetensors whose header names a 100,000-character dtype (safetensors' own
    error quotes it whole)."""
    header = json.dumps({"w": {"dtype": LONG, "shape": [1], "data_offsets": [0, 4]}}).encode()
    (path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(4))
    return "model.safetensors"


def _long_shard_name(path: Path) -> str:
    """A shard index naming a file outside the directory by 100,000 characters."""
    index = {"weight_map": {"model.embed_tokens.weight": "../" + LONG}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    return "model.safetensors.index.json"


LONG_CASES = [  # (family, config changed, files changed: the file named, what the line says)
    ("llama", dict(hidden_act=LONG), None, ("hidden_act='xxx", "' (100,000 characters) is not")),
    ("llama", dict(rope_scaling={"type": LONG}), None,
     ("rope_scaling rope_type='xxx", "' (100,000 characters) is not supported")),
    ("llama", dict(rope_scaling=LONG), None, ("rope_scaling is 'xxx", "' (100,000 characters);")),
    ("gpt2", dict(activation_function=LONG), None,
     ("activation_function 'xxx", "' (100,000 characters) has no")),
    ("llama", {}, _long_dtype, ("unknown variant `xxx", "characters)")),
    ("sharded", {}, _long_shard_name, ("directory: '../xxx", "' (100,003 characters)")),
]  # fmt: skip


@pytest.mark.parametrize(
    "family, changes, files, says",
    LONG_CASES,
    ids=["hidden-act", "rope-type", "rope-scaling", "activation", "dtype", "shard"],
)
def test_a_long_value_is_cut_in_the_one_line(saved, tmp_path, family, changes, files, says):
    """A 100,000-character value in config.json, a weights file or a shard index was
    echoed whole (by the reader, or by safetensors' or torch's message it passed on)."""
    path = _copy(saved, family, tmp_path)
    with_config(path, **changes)
    file = "config.json" if files is None else files(path)
    with pytest.raises(CheckpointError) as e:
        GPT.from_pretrained(path)
    message = str(e.value)
    assert "\n" not in message and len(message) < 1000, message[:2000]
    assert str(path / file) in message and all(needle in message for needle in says), message
