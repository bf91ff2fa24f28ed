"""circuit-tracer's transcoder directories (glassformer.interop.circuit_tracer): written by
its field names and read back to the same outputs; what it cannot hold refused in one line.
That circuit-tracer itself reads them is tests/test_graph.py's (its loader, in its own
environment, builds the graphs compared there)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from glassformer import TranscoderConfig, Transcoders
from glassformer.errors import CheckpointError
from glassformer.interop.circuit_tracer import read_circuit_tracer, write_circuit_tracer
from tests.graph_models import KINDS, small_transcoders


@pytest.mark.parametrize("kind", KINDS)
def test_a_written_directory_reads_back_to_the_same_transcoders(kind: str, tmp_path) -> None:
    tc = small_transcoders(kind)
    write_circuit_tracer(tc, tmp_path / "tc", scan="test-scan")
    meta = json.loads((tmp_path / "tc" / "config.yaml").read_text())
    assert meta["model_kind"] == ("cross_layer_transcoder" if "cross" in kind else "transcoder_set")
    assert meta["feature_input_hook"] == "mlp.hook_in"  # TransformerLens's name for it
    back = Transcoders.from_pretrained(tmp_path / "tc")  # the directory found by its config.yaml
    assert back.config.input_hook == "ln2.hook_normalized"
    assert back.config.architecture == tc.config.architecture
    x = torch.randn(3, 6, 32)
    with torch.no_grad():
        torch.testing.assert_close(back(x).outputs, tc(x).outputs)


def test_the_tensors_have_circuit_tracers_names_and_shapes(tmp_path) -> None:
    write_circuit_tracer(small_transcoders("jumprelu-skip"), tmp_path / "plt")
    layer = load_file(str(tmp_path / "plt" / "layer_1.safetensors"))
    assert {k: tuple(v.shape) for k, v in layer.items()} == {
        "W_enc": (40, 32), "W_dec": (40, 32), "b_enc": (40,), "b_dec": (32,),
        "W_skip": (32, 32), "activation_function.threshold": (40,)}  # fmt: skip
    write_circuit_tracer(small_transcoders("cross-layer"), tmp_path / "clt")
    dec = load_file(str(tmp_path / "clt" / "W_dec_1.safetensors"))
    assert tuple(dec["W_dec_1"].shape) == (40, 2, 32)  # layer 1 writes to layers 1 and 2
    assert set(load_file(str(tmp_path / "clt" / "W_enc_0.safetensors"))) == {
        "W_enc_0", "b_enc_0", "b_dec_0"}  # fmt: skip


def test_what_circuit_tracer_cannot_hold_is_refused(tmp_path) -> None:
    topk = Transcoders(TranscoderConfig(d_model=8, d_transcoder=16, layers=(0, 1), k=2))
    with pytest.raises(ValueError, match="circuit-tracer reads ReLU and JumpReLU.*TopK"):
        write_circuit_tracer(topk, tmp_path / "a")
    some = Transcoders(TranscoderConfig(d_model=8, d_transcoder=16, layers=(1, 2),
                                        architecture="relu"))  # fmt: skip
    with pytest.raises(ValueError, match=r"each of blocks 0 … n − 1.*\[1, 2\]"):
        write_circuit_tracer(some, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_damaged_directory_is_one_error(tmp_path) -> None:
    write_circuit_tracer(small_transcoders("relu"), tmp_path / "tc")
    path = tmp_path / "tc" / "layer_2.safetensors"
    weights = load_file(str(path))
    weights["W_dec"] = weights["W_dec"][:, :5].contiguous()
    save_file(weights, str(path))
    with pytest.raises(CheckpointError, match=r"W_dec per layer should be \(40, 32\)"):
        read_circuit_tracer(tmp_path / "tc")
    (tmp_path / "tc" / "config.yaml").write_text(json.dumps({
        "model_kind": "transcoder_set", "feature_input_hook": "ln2.hook_normalized",
        "feature_output_hook": "hook_mlp_out"}))  # fmt: skip
    with pytest.raises(CheckpointError, match="norm output before its weight"):
        read_circuit_tracer(tmp_path / "tc")
    (tmp_path / "tc" / "config.yaml").write_text("model_kind: [unclosed")
    with pytest.raises(CheckpointError, match="config.yaml"):
        read_circuit_tracer(tmp_path / "tc")
