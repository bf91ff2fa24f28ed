"""The pretrained model families, one file each: a typed config, ``from_hf``, the parts.

    llama.py      Llama, SmolLM2, TinyLlama: rotary, RMSNorm, SwiGLU, grouped-query
    mistral.py    Llama with a sliding window on every layer
    qwen2.py      Llama with q/k/v biases and sliding later layers
    qwen3.py      Qwen2 without the biases, with QK-norm
    gpt.py        the textbook decoder: GPT-2's block, or the modern one, by its fields
    gemma.py      Gemma 2 and 3: sandwich norms, soft caps, sliding layers, scaled embeddings
    gpt_neo.py    GPT-Neo (TinyStories): GPT-2's block, global and local layers, unscaled
    gpt_neox.py   GPT-NeoX / Pythia: partial rotary, parallel attention and MLP
    opt.py        OPT: GPT-2's parts with ReLU; OPT-350m's post-norm and narrow embeddings
    t5.py         T5, Flan-T5: positions as a bias on the scores, RMSNorm, no biases
    marian.py     MarianMT: the paper's post-norm translator, sines then cosines

``decoder.py`` holds what every family shares (``FamilyConfig``: the registry, the rules of
the Hugging Face fields) and what the decoders share (``DecoderConfig``); ``translator.py``
what the encoder-decoders share (``TranslatorConfig``). ``gpt.py`` is the textbook decoder,
GPT-2 included (``GPTConfig``, family "gpt"), which names every part in its fields; the
paper's translator is ``models.seq2seq.Seq2SeqConfig``. A saved config names its family
(``"family": "llama"``); ``GPTConfig.from_dict`` and ``Seq2SeqConfig.from_dict`` read any,
and a config saved before the families had files of their own as the family its fields
describe (``legacy.py``).
"""

from glassformer.models.families.decoder import FAMILIES, DecoderConfig, Readout
from glassformer.models.families.gemma import GemmaConfig
from glassformer.models.families.gpt import GPTClassifierConfig, GPTConfig
from glassformer.models.families.gpt_neo import GPTNeoConfig
from glassformer.models.families.gpt_neox import GPTNeoXConfig
from glassformer.models.families.llama import LlamaConfig
from glassformer.models.families.marian import MarianConfig
from glassformer.models.families.mistral import MistralConfig
from glassformer.models.families.opt import OPTConfig
from glassformer.models.families.qwen2 import Qwen2Config
from glassformer.models.families.qwen3 import Qwen3Config
from glassformer.models.families.t5 import T5Config
from glassformer.models.families.translator import TRANSLATORS, TranslatorConfig

__all__ = [
    "FAMILIES",
    "DecoderConfig",
    "GPTClassifierConfig",
    "GPTConfig",
    "GPTNeoConfig",
    "GPTNeoXConfig",
    "GemmaConfig",
    "LlamaConfig",
    "MarianConfig",
    "MistralConfig",
    "OPTConfig",
    "Qwen2Config",
    "Qwen3Config",
    "Readout",
    "T5Config",
    "TRANSLATORS",
    "TranslatorConfig",
]
