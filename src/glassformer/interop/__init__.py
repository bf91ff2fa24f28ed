"""Importers and exporters for other implementations' weights."""

from glassformer.interop.bert import from_bert_state, load_bert
from glassformer.interop.circuit_tracer import read_circuit_tracer, write_circuit_tracer
from glassformer.interop.gemma import from_gemma_state, load_gemma2, load_gemma3
from glassformer.interop.gguf import read_gguf, smollm2_path
from glassformer.interop.gguf.model import load_gguf
from glassformer.interop.gpt2 import from_gpt2_state, load_gpt2, save_gpt2, to_gpt2_state
from glassformer.interop.gpt_neo import from_gpt_neo_state, load_gpt_neo
from glassformer.interop.gpt_neox import from_gpt_neox_state, load_gpt_neox
from glassformer.interop.gptj import from_gptj_state, load_gptj
from glassformer.interop.llama import from_llama_state, load_llama, load_mistral
from glassformer.interop.marian import from_marian_state, load_marian
from glassformer.interop.mixtral import from_moe_state, load_mixtral, load_olmoe, load_qwen2_moe
from glassformer.interop.olmo import from_olmo_state, load_olmo, load_olmo2
from glassformer.interop.opt import from_opt_state, load_opt
from glassformer.interop.phi import from_phi_state, load_phi
from glassformer.interop.phi3 import from_phi3_state, load_phi3
from glassformer.interop.qwen import load_qwen2, load_qwen3
from glassformer.interop.saelens import (
    read_saelens,
    read_saelens_transcoders,
    saelens_files,
    write_saelens_transcoders,
)
from glassformer.interop.sentence import (
    from_sentence_transformers,
    load_sentence_encoder,
    minilm_dir,
)
from glassformer.interop.smollm2 import SMOLLM2_NAME, load_smollm2
from glassformer.interop.t5 import from_t5_state, load_t5
from glassformer.interop.torch_nn import from_torch_nn, to_torch_nn

__all__ = [
    "read_circuit_tracer",
    "read_saelens",
    "read_saelens_transcoders",
    "write_circuit_tracer",
    "saelens_files",
    "write_saelens_transcoders",
    "SMOLLM2_NAME",
    "from_bert_state",
    "from_gpt2_state",
    "from_gemma_state",
    "from_gpt_neo_state",
    "from_gpt_neox_state",
    "from_gptj_state",
    "from_llama_state",
    "from_marian_state",
    "from_moe_state",
    "from_olmo_state",
    "from_opt_state",
    "from_phi_state",
    "from_phi3_state",
    "from_sentence_transformers",
    "from_t5_state",
    "from_torch_nn",
    "load_bert",
    "load_gpt2",
    "load_gemma2",
    "load_gemma3",
    "load_gguf",
    "load_gpt_neo",
    "load_gpt_neox",
    "load_gptj",
    "load_llama",
    "load_marian",
    "load_mixtral",
    "load_olmo",
    "load_olmoe",
    "load_qwen2_moe",
    "load_olmo2",
    "load_mistral",
    "load_opt",
    "load_phi",
    "load_phi3",
    "load_qwen2",
    "load_qwen3",
    "load_sentence_encoder",
    "load_smollm2",
    "load_t5",
    "minilm_dir",
    "read_gguf",
    "save_gpt2",
    "smollm2_path",
    "to_gpt2_state",
    "to_torch_nn",
]
