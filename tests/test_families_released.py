"""Released checkpoints of each family against transformers, where they are already in the
local Hugging Face cache (nothing is downloaded: no package on the registries this project
reaches ships these weights, so on this project's machines these tests skip, saying so).

    pytest -m network tests/test_families_released.py
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")

RELEASED = {  # family → the smallest released checkpoints, the first cached one is used
    "Qwen2": ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B-Instruct"),
    "Qwen3": ("Qwen/Qwen3-0.6B",),
    "Gemma 3": ("google/gemma-3-270m", "google/gemma-3-1b-it"),
    "Gemma 2": ("google/gemma-2-2b",),
    "GPT-NeoX": ("EleutherAI/pythia-70m", "EleutherAI/pythia-160m"),
    "OPT": ("facebook/opt-125m",),
    "GPT-Neo": ("roneneldan/TinyStories-1M", "EleutherAI/gpt-neo-125m"),
    "OLMo 2": ("allenai/OLMo-2-0425-1B",),
    "OLMo": ("allenai/OLMo-1B-hf",),
    "Phi-3": ("microsoft/Phi-4-mini-instruct", "microsoft/Phi-3-mini-4k-instruct"),
    "Phi": ("microsoft/phi-1_5", "microsoft/phi-2"),
    "GPT-J": ("EleutherAI/gpt-j-6b",),
    "Llama": ("meta-llama/Llama-3.2-1B", "HuggingFaceTB/SmolLM2-135M"),
    "Mistral": ("mistralai/Mistral-7B-v0.1",),
    "MarianMT": ("Helsinki-NLP/opus-mt-en-de",),
    "T5": ("google/flan-t5-small", "google-t5/t5-small"),
}
TEXT = "The capital of France is"


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("family", sorted(RELEASED))
def test_a_released_checkpoint_gives_transformers_logits(family, released_checkpoint):
    from glassformer import GPT, Seq2SeqTransformer
    from glassformer.data.tokenizers import load_tokenizer

    path = released_checkpoint(*RELEASED[family])
    seq2seq = family in ("MarianMT", "T5")
    auto = transformers.AutoModelForSeq2SeqLM if seq2seq else transformers.AutoModelForCausalLM
    hf = auto.from_pretrained(path, dtype=torch.float32).eval()
    ours = (Seq2SeqTransformer if seq2seq else GPT).from_pretrained(path).float()  # as hf's
    ids = torch.tensor([load_tokenizer(path).encode(TEXT)])
    with torch.no_grad():
        if seq2seq:
            start = torch.tensor([[ours.config.bos_id]])
            expected = hf(ids, decoder_input_ids=start).logits
            got = ours(ids, start).logits
        else:
            expected, got = hf(ids).logits, ours(ids).logits
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-3)
    assert got[0, -1].argmax() == expected[0, -1].argmax()
