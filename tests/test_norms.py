"""RMSNorm against torch.nn.RMSNorm and Hugging Face's LlamaRMSNorm."""

import pytest
import torch

from glassformer.modules.norms import RMSNorm


def _pair(eps):
    ours = RMSNorm(16, eps=eps)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(16, generator=torch.Generator().manual_seed(0)))
    return ours


@pytest.mark.parametrize("eps", [1e-6, 1e-5, 0.5])
def test_matches_torch_rmsnorm(eps):
    ours = _pair(eps)
    ref = torch.nn.RMSNorm(16, eps=eps)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1)) * 0.3
    torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_llama_rmsnorm(dtype):
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    ours = _pair(1e-5).to(dtype)
    ref = llama.LlamaRMSNorm(16, eps=1e-5).to(dtype)
    ref.load_state_dict(ours.state_dict())
    x = (torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(2)) * 0.05).to(dtype)
    out = ours(x)
    assert out.dtype == dtype
    torch.testing.assert_close(out, ref(x), rtol=0, atol=0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="d_model"):
        RMSNorm(0)
    with pytest.raises(ValueError, match="eps"):
        RMSNorm(4, eps=-1.0)
