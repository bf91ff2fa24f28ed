"""The pretrained model families, one file each: a typed config, ``from_hf``, the parts.

    llama.py      Llama, SmolLM2, TinyLlama: rotary, RMSNorm, SwiGLU, grouped-query
    mistral.py    Llama with a sliding window on every layer
    qwen2.py      Llama with q/k/v biases and sliding later layers
    qwen3.py      Qwen2 without the biases, with QK-norm
    gpt.py        the textbook decoder: GPT-2's block, or the modern one, by its fields
    gemma.py      Gemma 2 and 3: sandwich norms, soft caps, sliding layers, scaled embeddings
    gpt_neo.py    GPT-Neo (TinyStories): GPT-2's block, global and local layers, unscaled
    gpt_neox.py   GPT-NeoX / Pythia: partial rotary, parallel attention and MLP
    gptj.py       GPT-J: one norm, parallel attention and MLP, rotary on neighbouring pairs
    mixtral.py    Mixtral: Mistral with a mixture of experts for its MLP
    olmoe.py      OLMoE: OLMo 2's QK-norm, Llama's norms, 64 experts
    qwen2_moe.py  Qwen2-MoE, Qwen1.5-MoE: Qwen2 with small experts and a shared one
    olmo.py       OLMo 1 (norms that learn nothing, clamped q/k/v) and OLMo 2 (norms after)
    opt.py        OPT: GPT-2's parts with ReLU; OPT-350m's post-norm and narrow embeddings
    phi.py        Phi-1, Phi-1.5, Phi-2: one norm, parallel attention and MLP, partial rotary
    phi3.py       Phi-3, Phi-3.5, Phi-4-mini: Mistral's parts, partial rotary, LongRoPE
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
from glassformer.models.families.gptj import GPTJConfig
from glassformer.models.families.llama import LlamaConfig
from glassformer.models.families.marian import MarianConfig
from glassformer.models.families.mistral import MistralConfig
from glassformer.models.families.mixtral import MixtralConfig
from glassformer.models.families.olmo import Olmo2Config, OlmoConfig
from glassformer.models.families.olmoe import OlmoeConfig
from glassformer.models.families.opt import OPTConfig
from glassformer.models.families.phi import PhiConfig
from glassformer.models.families.phi3 import Phi3Config
from glassformer.models.families.qwen2 import Qwen2Config
from glassformer.models.families.qwen2_moe import Qwen2MoeConfig
from glassformer.models.families.qwen3 import Qwen3Config
from glassformer.models.families.t5 import T5Config
from glassformer.models.families.translator import TRANSLATORS, TranslatorConfig

__all__ = [
    "FAMILIES",
    "DecoderConfig",
    "GPTClassifierConfig",
    "GPTConfig",
    "GPTNeoConfig",
    "GPTJConfig",
    "GPTNeoXConfig",
    "GemmaConfig",
    "LlamaConfig",
    "MarianConfig",
    "MistralConfig",
    "MixtralConfig",
    "OlmoeConfig",
    "Qwen2MoeConfig",
    "OPTConfig",
    "Olmo2Config",
    "OlmoConfig",
    "Phi3Config",
    "PhiConfig",
    "Qwen2Config",
    "Qwen3Config",
    "Readout",
    "T5Config",
    "TRANSLATORS",
    "TranslatorConfig",
]
