"""Transcoders (glassformer.models.transcoder): what each layer computes, checked against the
formulas written out by hand; decoder-norm folding; the config's checks."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from glassformer import TranscoderConfig, Transcoders
from tests.graph_models import small_transcoders


def _by_hand(tc: Transcoders, x: torch.Tensor) -> torch.Tensor:
    """Each layer's output from the definitions, one layer and one feature row at a time."""
    n = tc.config.n_layers
    z = [torch.relu(x[i] @ tc.W_enc[i].T + tc.b_enc[i]) for i in range(n)]
    if tc.config.architecture == "jumprelu":
        z = [zi * (x[i] @ tc.W_enc[i].T + tc.b_enc[i] > tc.threshold[i])
             for i, zi in enumerate(z)]  # fmt: skip
    out = []
    for j in range(n):
        y = tc.b_dec[j].expand(x.size(1), -1).clone()
        for i in range(n):
            if tc.config.cross_layer and i <= j:
                y += z[i] @ tc.W_dec[i][:, j - i]
            elif not tc.config.cross_layer and i == j:
                y += z[i] @ tc.W_dec[i]
        if tc.config.skip:
            y += x[j] @ tc.W_skip[j].T
        out.append(y)
    return torch.stack(out)


@pytest.mark.parametrize("kind", ["relu", "jumprelu-skip", "cross-layer", "cross-layer-jumprelu"])
def test_each_layer_computes_what_the_formulas_say(kind: str) -> None:
    tc = small_transcoders(kind)
    x = torch.randn(3, 5, 32)
    with torch.no_grad():
        torch.testing.assert_close(tc(x).outputs, _by_hand(tc, x), atol=1e-5, rtol=1e-5)
        z = tc.encode(x)
        for i in range(3):  # one layer alone gives the same features
            torch.testing.assert_close(tc.encode_layer(x[i], i), z[i])


def test_topk_keeps_k_features_per_token_and_layer() -> None:
    tc = Transcoders(TranscoderConfig(d_model=16, d_transcoder=64, layers=(0, 2), k=5))
    with torch.no_grad():
        tc.b_enc.fill_(1.0)  # every evidence positive: exactly k fire
        z = tc.encode(torch.randn(2, 7, 16))
    assert ((z > 0).sum(-1) == 5).all()


@pytest.mark.parametrize(("cross", "architecture"),
                         [(False, "topk"), (True, "topk"), (False, "jumprelu")])  # fmt: skip
def test_folding_the_decoder_norms_changes_no_output(cross: bool, architecture: str) -> None:
    config = TranscoderConfig(d_model=16, d_transcoder=48, layers=(0, 1, 2), k=6,
                              cross_layer=cross, rescale_acts_by_decoder_norm=True,
                              architecture=architecture)  # fmt: skip
    torch.manual_seed(0)
    tc = Transcoders(config)
    with torch.no_grad():
        for p in tc.parameters():
            p.mul_(torch.rand_like(p) + 0.5)  # decoder rows of uneven norms
        if architecture == "jumprelu":
            tc.threshold.uniform_(0.0, 0.3)
        x = torch.randn(3, 9, 16)
        plain = tc.unfolded()
        torch.testing.assert_close(plain.encode(x), tc.encode(x), atol=1e-5, rtol=1e-5)
        assert not plain.config.rescale_acts_by_decoder_norm
        torch.testing.assert_close(plain(x).outputs, tc(x).outputs, atol=1e-5, rtol=1e-5)
        for i in range(3):
            norms = plain.decoder(i).flatten(1).norm(dim=1)
            torch.testing.assert_close(norms, torch.ones_like(norms))


def test_wrong_input_shapes_and_configs_are_one_line_errors() -> None:
    tc = small_transcoders("relu")
    with pytest.raises(ValueError, match=r"read activations \(layers 3, tokens, width 32\).*"
                       r"got \(2, 5, 32\)"):  # fmt: skip
        tc(torch.randn(2, 5, 32))
    with pytest.raises(ValueError, match="layers must be block indices in increasing order"):
        TranscoderConfig(layers=(2, 1))
    with pytest.raises(ValueError, match="architecture must be one of topk, relu, jumprelu"):
        TranscoderConfig(architecture="gated")
    with pytest.raises(ValueError, match=r"k must be between 1 and d_transcoder \(8\), got 9"):
        TranscoderConfig(d_transcoder=8, k=9)
    skip = Transcoders(dataclasses.replace(tc.config, skip=True))
    with pytest.raises(ValueError, match="skip transcoders decode from their inputs too"):
        skip.decode(torch.zeros(3, 2, 40))
