"""The activation store (glassformer.data.activations): shards written once and read back
as the same numbers, its size estimated and refused where the disk is short, another run's
store refused, a damaged shard one error. That training from it gives exactly what training
from the stream gives is tests/test_transcoder_task.py's."""

from __future__ import annotations

import shutil
from collections import namedtuple

import pytest
import torch

from glassformer.data.activations import ActivationStore
from glassformer.errors import CheckpointError

ABOUT = {"model": "m", "layers": [0, 1]}


def test_a_region_is_computed_once_then_read_as_the_same_numbers(tmp_path):
    calls = []

    def compute(r: int) -> torch.Tensor:
        calls.append(r)
        return torch.randn(2, 3, 5, 4)

    store = ActivationStore.open(tmp_path / "s", ABOUT, (2, 3, 5, 4), regions=3)
    first = store.region(1, compute)
    again = ActivationStore.open(tmp_path / "s", ABOUT, (2, 3, 5, 4), regions=3)
    assert torch.equal(again.region(1, compute), first) and calls == [1]
    assert again.written() == 1


def test_another_runs_store_is_refused_naming_what_differs(tmp_path):
    ActivationStore.open(tmp_path / "s", ABOUT, (2, 3, 5, 4), regions=3)
    with pytest.raises(ValueError, match=r"another run \(differing in layers\)"):
        ActivationStore.open(tmp_path / "s", {**ABOUT, "layers": [0]}, (2, 3, 5, 4), regions=3)


def test_a_store_larger_than_the_disk_is_refused_before_it_is_written(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 0, 10**9))
    with pytest.raises(ValueError, match=r"would take 2\.4 GB \(300 shards of 8 MB\).*1\.0 GB"):
        ActivationStore.open(tmp_path / "s", ABOUT, (2, 1000, 1000), regions=300)
    assert not (tmp_path / "s" / "store.json").exists()


def test_a_damaged_shard_is_one_error(tmp_path):
    store = ActivationStore.open(tmp_path / "s", ABOUT, (2, 4), regions=1)
    store.region(0, lambda r: torch.zeros(2, 4))
    store.shard(0).write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="cannot read .*region-00000"):
        store.region(0, lambda r: torch.zeros(2, 4))
