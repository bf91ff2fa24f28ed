"""The pretrained decoder families, one file each: a typed config, ``from_hf``, the parts.

    llama.py      Llama, SmolLM2, TinyLlama: rotary, RMSNorm, SwiGLU, grouped-query
    mistral.py    Llama with a sliding window on every layer
    qwen2.py      Llama with q/k/v biases and sliding later layers
    qwen3.py      Qwen2 without the biases, with QK-norm
    gpt.py        the textbook decoder: GPT-2's block, or the modern one, by its fields
    gemma.py      Gemma 2 and 3: sandwich norms, soft caps, sliding layers, scaled embeddings
    gpt_neox.py   GPT-NeoX / Pythia: partial rotary, parallel attention and MLP
    opt.py        OPT: GPT-2's parts with ReLU; OPT-350m's post-norm and narrow embeddings

``decoder.py`` holds what they share (``DecoderConfig``, the rules of the Hugging Face
fields). ``gpt.py`` is the textbook decoder, GPT-2 included (``GPTConfig``, family "gpt"),
which names every part in its fields. A saved config names its family (``"family":
"llama"``); ``GPTConfig.from_dict`` reads any, and a config saved before the families had
files of their own as the family its fields describe (``legacy.py``).
"""

from glassformer.models.families.decoder import FAMILIES, DecoderConfig, Readout
from glassformer.models.families.gemma import GemmaConfig
from glassformer.models.families.gpt import GPTClassifierConfig, GPTConfig
from glassformer.models.families.gpt_neox import GPTNeoXConfig
from glassformer.models.families.llama import LlamaConfig
from glassformer.models.families.mistral import MistralConfig
from glassformer.models.families.opt import OPTConfig
from glassformer.models.families.qwen2 import Qwen2Config
from glassformer.models.families.qwen3 import Qwen3Config

__all__ = [
    "FAMILIES",
    "DecoderConfig",
    "GPTClassifierConfig",
    "GPTConfig",
    "GPTNeoXConfig",
    "GemmaConfig",
    "LlamaConfig",
    "MistralConfig",
    "OPTConfig",
    "Qwen2Config",
    "Qwen3Config",
    "Readout",
]
