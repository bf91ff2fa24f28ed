"""SAELens's transcoder directories (glassformer.interop.saelens): each layer of a set
written as SAELens's per-layer transcoder by its field names and shapes, read back to the
same outputs; what SAELens cannot hold refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from glassformer import TranscoderConfig, Transcoders
from glassformer.errors import CheckpointError
from glassformer.interop import read_saelens_transcoders, write_saelens_transcoders
from tests.graph_models import small_transcoders


@pytest.mark.parametrize(
    ("kind", "architecture"),
    [("relu", "transcoder"), ("jumprelu-skip", "jumprelu_skip_transcoder")],
)
def test_each_layer_is_a_saelens_transcoder_and_reads_back(kind, architecture, tmp_path):
    tc = small_transcoders(kind)
    write_saelens_transcoders(tc, tmp_path / "tc")
    cfg = json.loads((tmp_path / "tc" / "blocks.1" / "cfg.json").read_text())
    assert cfg["architecture"] == architecture and not cfg["apply_b_dec_to_input"]
    assert cfg["metadata"]["hook_name"] == "blocks.1.ln2.hook_normalized"
    assert cfg["metadata"]["hook_name_out"] == "blocks.1.hook_mlp_out"
    shapes = {
        k: tuple(v.shape)
        for k, v in load_file(str(tmp_path / "tc" / "blocks.1" / "sae_weights.safetensors")).items()
    }
    assert shapes["W_enc"] == (32, 40) and shapes["W_dec"] == (
        40,
        32,
    )  # (d_in, d_sae), (d_sae, d_out)
    assert ("W_skip" in shapes) == ("skip" in kind) == (shapes.get("W_skip") == (32, 32))
    back = read_saelens_transcoders(tmp_path / "tc")
    assert back.config.layers == (0, 1, 2) and back.config.skip == tc.config.skip
    x = torch.randn(3, 5, 32)
    with torch.no_grad():
        torch.testing.assert_close(back(x).outputs, tc(x).outputs)


def test_what_saelens_cannot_hold_is_refused(tmp_path):
    topk = Transcoders(TranscoderConfig(d_model=8, d_transcoder=16, layers=(0,), k=2))
    with pytest.raises(ValueError, match="per-layer ReLU or JumpReLU ones; these are topk"):
        write_saelens_transcoders(topk, tmp_path / "a")
    with pytest.raises(ValueError, match="these are cross-layer"):
        write_saelens_transcoders(small_transcoders("cross-layer"), tmp_path / "b")
    (tmp_path / "c" / "x").mkdir(parents=True)
    (tmp_path / "c" / "x" / "cfg.json").write_text(json.dumps({"architecture": "topk"}))
    with pytest.raises(CheckpointError, match="not a SAELens transcoder"):
        read_saelens_transcoders(tmp_path / "c")
