"""models/families: a family is one file (typed config, from_hf, parts), saved configs name
their family, configs saved before the families had files still load, and a made-up family
costs one class."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch

from glassformer import GPT, GPTConfig, Seq2SeqConfig, Seq2SeqTransformer
from glassformer.checkpoint import CheckpointError
from glassformer.models.families import (
    FAMILIES,
    DecoderConfig,
    GemmaConfig,
    GPTJConfig,
    GPTNeoConfig,
    GPTNeoXConfig,
    LlamaConfig,
    MarianConfig,
    MistralConfig,
    MixtralConfig,
    Olmo2Config,
    OlmoConfig,
    OlmoeConfig,
    OPTConfig,
    Phi3Config,
    PhiConfig,
    Qwen2Config,
    Qwen2MoeConfig,
    Qwen3Config,
    T5Config,
)
from glassformer.modules.attention import MultiHeadAttention
from glassformer.modules.block import Block
from glassformer.modules.feedforward import FeedForward
from glassformer.modules.norms import RMSNorm
from glassformer.modules.position import TokenEmbedding
from glassformer.modules.rotary import RotaryEmbedding

SIZE = dict(vocab_size=40, max_len=32, d_model=32, num_heads=4, num_layers=2, d_ff=48)
IDS = torch.tensor([[1, 5, 9, 2, 7, 3]])
# (family config, transformers' config class, what that class needs at this size)
HF = [
    (LlamaConfig, "LlamaConfig", {}),
    (MistralConfig, "MistralConfig", {"sliding_window": 4, "num_key_value_heads": 2}),
    (Qwen2Config, "Qwen2Config", {"num_key_value_heads": 2}),
    (Qwen3Config, "Qwen3Config", {"head_dim": 8, "num_key_value_heads": 2}),
    (GemmaConfig, "Gemma3TextConfig", {"head_dim": 8}),
    (GPTNeoXConfig, "GPTNeoXConfig", {}),
    (OPTConfig, "OPTConfig", {}),
    (GPTNeoConfig, "GPTNeoConfig", {"attention_types": [[["global", "local"], 1]]}),
    (OlmoConfig, "OlmoConfig", {"clip_qkv": 8.0}),
    (Olmo2Config, "Olmo2Config", {}),
    (Phi3Config, "Phi3Config", {"sliding_window": 4}),
    (PhiConfig, "PhiConfig", {}),
    (GPTJConfig, "GPTJConfig", {"rotary_dim": 4}),
    (MixtralConfig, "MixtralConfig", {"num_key_value_heads": 2, "num_local_experts": 4}),
    (OlmoeConfig, "OlmoeConfig", {"num_experts": 4, "num_experts_per_tok": 2}),
    (Qwen2MoeConfig, "Qwen2MoeConfig", {"num_key_value_heads": 2, "num_experts": 4}),
]
HF_SIZE = dict(vocab_size=40, hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
               intermediate_size=48, max_position_embeddings=32)  # fmt: skip


def made(family: type[DecoderConfig], **changes: Any) -> DecoderConfig:
    extra: dict[str, Any] = {"head_dim": 8} if family is GemmaConfig else {}
    return family(**{**SIZE, **extra, **changes})


def hf_config(name: str, needs: dict[str, Any]) -> dict[str, Any]:
    """transformers' own config.json of a small model of this family, every field it writes."""
    transformers = pytest.importorskip("transformers")
    size = dict(HF_SIZE)
    if name == "OPTConfig":
        size.update(ffn_dim=size.pop("intermediate_size"), word_embed_proj_dim=32)
    if name == "GPTJConfig":  # GPT-2's names
        size = dict(vocab_size=40, n_embd=32, n_head=4, n_layer=2, n_inner=48, n_positions=32)
    if name == "GPTNeoConfig":  # its own names for the heads and layers
        size.update(
            num_heads=size.pop("num_attention_heads"), num_layers=size.pop("num_hidden_layers")
        )
    return getattr(transformers, name)(**size, **needs).to_dict()


@pytest.mark.parametrize(("family", "name", "needs"), HF, ids=[h[1] for h in HF])
def test_every_field_transformers_writes_is_read_or_known(family, name, needs):
    """A config.json exactly as transformers writes it (every field of its config class) is
    read without a refusal; the family's fields come out as the file says."""
    hf = hf_config(name, needs)
    config = family.from_hf(hf)
    assert (config.d_model, config.num_layers, config.vocab_size) == (32, 2, 40)
    assert type(config) is family


@pytest.mark.parametrize(("family", "name", "needs"), HF, ids=[h[1] for h in HF])
def test_a_field_no_family_knows_is_refused_by_name(family, name, needs):
    hf = {**hf_config(name, needs), "rope_wobble": 0.5}
    with pytest.raises(CheckpointError, match=r"\['rope_wobble'\] are not known to glassformer"):
        family.from_hf(hf)


# SmolLM2-135M's config.json as published on the Hub (fields transformers' class lacks)
SMOLLM2 = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576,
    "initializer_range": 0.041666666666666664, "intermediate_size": 1536,
    "is_llama_config": True, "max_position_embeddings": 8192, "model_type": "llama",
    "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_interleaved": False,
    "rope_scaling": None, "rope_theta": 100000, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": True,
    "vocab_size": 49152,
}  # fmt: skip


def test_a_published_config_with_fields_of_its_own_is_read():
    config = LlamaConfig.from_hf(SMOLLM2)
    assert (config.num_kv_heads, config.rope_theta, config.norm_eps) == (3, 1e5, 1e-5)
    assert config.tie_weights and config.width == 64
    with pytest.raises(CheckpointError, match="rope_interleaved=True is not supported"):
        LlamaConfig.from_hf({**SMOLLM2, "rope_interleaved": True})
    with pytest.raises(CheckpointError, match=r"\['quantization_config'\] are not known"):
        LlamaConfig.from_hf({**SMOLLM2, "quantization_config": {"bits": 4}})


def test_a_misspelt_field_is_an_error_not_a_default():
    """No field is read by name with a default: a typo is a TypeError naming it."""
    with pytest.raises(TypeError, match="rope_thetta"):
        LlamaConfig(**SIZE, rope_thetta=5e5)
    with pytest.raises(TypeError, match="sandwich_norms"):
        GPTConfig(vocab_size=10, sandwich_norms=True)  # Gemma's part, not the textbook's


def test_a_family_config_is_frozen_and_checked():
    config = made(LlamaConfig)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.rope_theta = 1.0  # type: ignore[misc]
    with pytest.raises(ValueError, match="num_kv_heads must be a positive divisor"):
        made(LlamaConfig, num_kv_heads=3)
    with pytest.raises(ValueError, match=r"full_attention_layers must be layer indices in 0\.\.1"):
        made(Qwen2Config, attention_window=3, full_attention_layers=[2])
    with pytest.raises(ValueError, match="rotary_dim must be an even number"):
        made(GPTNeoXConfig, rotary_dim=3)
    with pytest.raises(ValueError, match="local_layers need an attention_window"):
        made(GPTNeoConfig, local_layers=[1])
    with pytest.raises(ValueError, match="clip_qkv"):
        made(OlmoConfig, clip_qkv=0.0)


@pytest.mark.parametrize(
    "config",
    [
        made(LlamaConfig),
        made(MistralConfig, attention_window=3),
        made(Qwen2Config, attention_window=3, full_attention_layers=[0]),
        made(Qwen3Config, head_dim=16),
        made(
            GemmaConfig,
            attention_window=3,
            full_attention_layers=[1],
            rope_local_theta=100.0,
            final_softcap=5.0,
        ),  # fmt: skip
        made(GemmaConfig, version=2, attention_softcap=0.5),
        made(GPTNeoXConfig, rotary_dim=4),
        made(OPTConfig, embed_dim=16, norm_first=False, final_norm=False),
        made(GPTNeoConfig, attention_window=3, local_layers=[1]),
        made(OlmoConfig, clip_qkv=0.5),
        made(Olmo2Config, num_kv_heads=2),
        made(Phi3Config, rotary_dim=4, attention_window=3),
        made(PhiConfig, rotary_dim=4, num_kv_heads=2, qk_norm=True),
        made(GPTJConfig, rotary_dim=4),
        made(MixtralConfig, num_experts=4, top_k=2, attention_window=3),
        made(OlmoeConfig, num_experts=4, top_k=3),
        made(
            Qwen2MoeConfig, num_experts=4, top_k=2, expert_d_ff=16, shared_d_ff=24, dense_layers=[1]
        ),
    ],
    ids=lambda c: c.family,
)
def test_a_saved_family_model_loads_as_its_family(tmp_path, config):
    """config.json names the family; loading gives the same config and the same logits."""
    torch.manual_seed(0)
    model = GPT(config).eval()
    model.save_pretrained(tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())["config"]
    assert saved["family"] == config.family
    again = GPT.from_pretrained(tmp_path / "m").eval()
    assert again.config == config
    with torch.no_grad():
        torch.testing.assert_close(again(IDS).logits, model(IDS).logits, rtol=0, atol=0)


def test_an_unknown_family_is_one_error():
    with pytest.raises(ValueError, match=r"unknown model family 'falcon'; known: \["):
        GPTConfig.from_dict({"family": "falcon", **SIZE})


# Configs as GPTConfig wrote them before the families had files of their own (the fields
# the interop readers of that time set), and the family each is.
OLD = dict(vocab_size=40, max_len=32, d_model=32, num_heads=4, num_layers=2, d_ff=48,
           dropout=0.0, pad_id=None, tie_weights=False)  # fmt: skip
MODERN = dict(positional="rope", norm="rms", activation="swiglu", norm_eps=1e-6,
              layer_norm_eps=1e-6, qkv_bias=False)  # fmt: skip
LEGACY = [
    (
        {
            **OLD,
            **MODERN,
            "bias": "qkv",
            "qkv_bias": True,
            "attention_window": 3,
            "full_attention_layers": [0],
        },
        Qwen2Config,
    ),  # fmt: skip
    (
        {**OLD, **MODERN, "bias": False, "qk_norm": True, "head_dim": 16, "num_kv_heads": 2},
        Qwen3Config,
    ),  # fmt: skip
    (
        {
            **OLD,
            **MODERN,
            "norm": "gemma_rms",
            "activation": "geglu_tanh",
            "bias": False,
            "head_dim": 8,
            "qk_norm": True,
            "scale_embeddings": True,
            "sandwich_norms": True,
            "attention_scale": 0.3,
            "attention_window": 3,
            "full_attention_layers": [1],
            "rope_local_theta": 100.0,
            "final_softcap": 5.0,
            "tie_weights": True,
        },
        GemmaConfig,
    ),  # fmt: skip
    ({**OLD, "positional": "rope", "rotary_dim": 4, "parallel": True}, GPTNeoXConfig),
    (
        {**OLD, "activation": "relu", "norm_first": False, "final_norm": False, "embed_dim": 16},
        OPTConfig,
    ),  # fmt: skip
]


@pytest.mark.parametrize(("old", "family"), LEGACY, ids=[f.family for _, f in LEGACY])
def test_a_config_saved_before_the_families_loads_as_its_family(tmp_path, old, family):
    """A checkpoint whose config.json is in the old GPTConfig form (no family, the family's
    parts as GPTConfig fields) loads as that family with the same weights and logits."""
    config = GPTConfig.from_dict(old)
    assert type(config) is family
    torch.manual_seed(0)
    model = GPT(config).eval()
    model.save_pretrained(tmp_path / "m")
    file = tmp_path / "m" / "config.json"
    saved = json.loads(file.read_text())
    file.write_text(json.dumps({**saved, "config": old}))
    again = GPT.from_pretrained(tmp_path / "m").eval()
    assert again.config == config
    with torch.no_grad():
        torch.testing.assert_close(again(IDS).logits, model(IDS).logits, rtol=0, atol=0)


def test_an_old_textbook_config_drops_the_fields_at_their_old_defaults():
    old = {**OLD, **MODERN, "qk_norm": False, "parallel": False, "full_attention_layers": [],
           "final_norm": True, "embed_dim": None, "bias": False}  # fmt: skip
    config = GPTConfig.from_dict(old)
    assert type(config) is GPTConfig and config.positional == "rope" and not config.bias


@pytest.mark.parametrize(
    ("old", "clash"),
    [
        ({**OLD, **MODERN, "sandwich_norms": True}, "'norm': 'rms'"),  # Gemma's norms, Llama's MLP
        ({**LEGACY[2][0], "scale_embeddings": False}, "'scale_embeddings': False"),
        ({**LEGACY[3][0], "embed_dim": 16}, "'embed_dim': 16"),  # OPT's part on a GPT-NeoX
        ({**LEGACY[4][0], "attention_window": 3}, "'attention_window': 3"),
    ],
)  # fmt: skip
def test_an_old_config_no_family_builds_is_refused_by_what_clashes(old, clash):
    """A part the family it reads as does not have is named, never silently dropped."""
    with pytest.raises(ValueError, match=f"reads as .*has .*{clash}"):
        GPTConfig.from_dict(old)


def test_a_family_config_is_not_a_textbook_classifiers():
    from glassformer.models.gpt import GPTClassifierConfig

    with pytest.raises(ValueError, match="GPTClassifierConfig is built on the textbook GPT"):
        GPTClassifierConfig.from_dict(made(LlamaConfig).to_dict())


# ---- adding a family: the worked example of docs/architecture.md ------------------------


@dataclass(frozen=True, kw_only=True)
class PicoConfig(DecoderConfig):
    """A made-up family: rotary positions, RMSNorm, a ReLU MLP, every layer sliding a
    window over the keys before each query."""

    family: ClassVar[str] = "pico"
    title: ClassVar[str] = "Pico"
    HF_READS: ClassVar[frozenset[str]] = frozenset({"vocab_size", "n_embd", "n_layer"})

    window: int = 4  # keys before each query every layer sees

    def block(self) -> Block:
        return Block(
            attn=MultiHeadAttention(
                d_model=self.d_model,
                num_heads=self.num_heads,
                causal=True,
                rotary=True,
                window=(self.window, 0),
            ),  # fmt: skip
            mlp=FeedForward(d_model=self.d_model, d_ff=self.d_ff, activation="relu"),
            ln1=RMSNorm(self.d_model, eps=self.norm_eps),
            ln2=RMSNorm(self.d_model, eps=self.norm_eps),
        )

    def parts(self) -> dict[str, Any]:
        return dict(
            embed=TokenEmbedding(vocab_size=self.vocab_size, d_model=self.d_model),
            rotary=RotaryEmbedding(self.width),
            blocks=[self.block() for _ in range(self.num_layers)],
            ln_final=RMSNorm(self.d_model, eps=self.norm_eps),
            max_len=self.max_len,
        )

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> PicoConfig:
        cls.check_hf_fields(hf)
        return cls(vocab_size=hf["vocab_size"], d_model=hf["n_embd"], num_heads=4,
                   num_layers=hf["n_layer"], d_ff=4 * hf["n_embd"])  # fmt: skip


def test_a_made_up_family_is_one_class_and_works_end_to_end(tmp_path):
    """Registered by being defined; built, run, cached decoding equal to the full forward,
    saved and loaded by its name; the tools read its hook names."""
    assert FAMILIES["pico"] is PicoConfig
    config = PicoConfig.from_hf({"vocab_size": 40, "n_embd": 32, "n_layer": 2})
    torch.manual_seed(0)
    model = GPT(config).eval()
    assert [b.attn.window for b in model.blocks] == [(4, 0), (4, 0)]
    out = model.generate(IDS, 8)
    with torch.no_grad():  # greedy decoding with the cache = argmax of full forwards
        ids = IDS
        for _ in range(8):
            ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(out, ids)
    model.save_pretrained(tmp_path / "pico")
    again = GPT.from_pretrained(tmp_path / "pico")
    assert again.config == config
    assert "blocks.1.attn.hook_pattern" in again.hook_names()


def test_a_classifier_starts_from_a_family_models_blocks(tmp_path):
    """``train classify --init`` on a pretrained family's model (SmolLM2's kind): the
    classifier runs the family's own blocks with the source's weights, and saves and loads."""
    from glassformer.models.backbone import Backbone
    from glassformer.training.tasks.classify import classifier_from_encoder

    torch.manual_seed(0)
    source = GPT(made(Qwen3Config, head_dim=16, num_kv_heads=2)).eval()
    classifier = classifier_from_encoder(source, 3).eval()
    assert classifier.config.decoder == source.config.to_dict()
    with torch.no_grad():
        ours = Backbone.forward(classifier, IDS, None)[0]
        theirs = Backbone.forward(source, IDS, None)[0]
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    classifier.save_pretrained(tmp_path / "clf")
    again = type(classifier).from_pretrained(tmp_path / "clf").eval()
    with torch.no_grad():
        torch.testing.assert_close(again(IDS).logits, classifier(IDS).logits, rtol=0, atol=0)


# ---- the translators: T5 and Marian -------------------------------------------------------

TRANSLATOR = dict(src_vocab_size=40, tgt_vocab_size=40, d_model=32, num_heads=4,
                  num_encoder_layers=2, num_decoder_layers=2, d_ff=48, max_len=32)  # fmt: skip
SRC, TGT = torch.tensor([[5, 6, 7, 1]]), torch.tensor([[0, 9, 8]])
HF_TRANSLATORS = [
    (T5Config, "T5Config", dict(vocab_size=40, d_model=32, d_kv=8, d_ff=48, num_layers=2,
                                num_heads=4, feed_forward_proj="gated-gelu")),
    (MarianConfig, "MarianConfig", dict(vocab_size=40, d_model=32, encoder_layers=2,
                                        decoder_layers=2, encoder_attention_heads=4,
                                        decoder_attention_heads=4, encoder_ffn_dim=48,
                                        decoder_ffn_dim=48, pad_token_id=39,
                                        decoder_start_token_id=39, eos_token_id=0)),
]  # fmt: skip


@pytest.mark.parametrize(("family", "name", "size"), HF_TRANSLATORS, ids=["t5", "marian"])
def test_every_field_transformers_writes_for_a_translator_is_read_or_known(family, name, size):
    transformers = pytest.importorskip("transformers")
    hf = getattr(transformers, name)(**size).to_dict()
    config = family.from_hf(hf)
    assert (config.d_model, config.num_encoder_layers, config.src_vocab_size) == (32, 2, 40)
    with pytest.raises(CheckpointError, match=r"\['rope_wobble'\] are not known"):
        family.from_hf({**hf, "rope_wobble": 1})


def test_an_old_marian_flag_with_another_value_is_refused():
    transformers = pytest.importorskip("transformers")
    hf = transformers.MarianConfig(**HF_TRANSLATORS[1][2]).to_dict()
    with pytest.raises(CheckpointError, match="Marian normalize_before=True is not supported"):
        MarianConfig.from_hf({**hf, "normalize_before": True})


@pytest.mark.parametrize(
    "config",
    [T5Config(**TRANSLATOR, activation="geglu_tanh", relative_buckets=8, relative_max_distance=16),
     MarianConfig(**TRANSLATOR, scale_embeddings=True)],
    ids=["t5", "marian"],
)  # fmt: skip
def test_a_saved_translator_loads_as_its_family(tmp_path, config):
    torch.manual_seed(0)
    model = Seq2SeqTransformer(config).eval()
    model.save_pretrained(tmp_path / "m")
    again = Seq2SeqTransformer.from_pretrained(tmp_path / "m").eval()
    assert again.config == config
    with torch.no_grad():
        torch.testing.assert_close(again(SRC, TGT).logits, model(SRC, TGT).logits, rtol=0, atol=0)


OLD_T5 = dict(src_vocab_size=40, tgt_vocab_size=40, d_model=32, num_heads=4, head_dim=8,
              num_encoder_layers=2, num_decoder_layers=2, d_ff=48, max_len=32, dropout=0.0,
              activation="geglu_tanh", norm_first=True, norm="rms", layer_norm_eps=1e-6,
              bias=False, positional="relative", relative_buckets=8, relative_max_distance=16,
              attention_scale=1.0, scale_embeddings=False, share_embeddings=True,
              tie_output=True, scale_output=True, pad_id=0, bos_id=0, eos_id=1)  # fmt: skip


def test_a_t5_saved_before_the_families_loads_as_a_t5(tmp_path):
    """A translator config.json in the old Seq2SeqConfig form with T5's fields loads as a
    T5 with the same weights and logits; one of them at a value T5 lacks is named."""
    config = Seq2SeqConfig.from_dict(OLD_T5)
    assert type(config) is T5Config and config.scale_output and config.relative_buckets == 8
    torch.manual_seed(0)
    model = Seq2SeqTransformer(config).eval()
    model.save_pretrained(tmp_path / "m")
    file = tmp_path / "m" / "config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), "config": OLD_T5}))
    again = Seq2SeqTransformer.from_pretrained(tmp_path / "m").eval()
    with torch.no_grad():
        torch.testing.assert_close(again(SRC, TGT).logits, model(SRC, TGT).logits, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"reads as T5 .*'bias': True"):
        Seq2SeqConfig.from_dict({**OLD_T5, "bias": True})
    plain = Seq2SeqConfig.from_dict({**TRANSLATOR, "attention_scale": None, "scale_output": False})
    assert type(plain) is Seq2SeqConfig  # T5's fields at their old defaults: the paper's


def test_bert_reads_every_field_transformers_writes_and_refuses_the_rest():
    """BERT's config (models/bert.py, its one file) reads a config.json as transformers
    writes it; an unknown field, and a causal or cross-attending BERT, are refused."""
    from glassformer.models.bert import BertConfig

    transformers = pytest.importorskip("transformers")
    hf = transformers.BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=48).to_dict()  # fmt: skip
    config = BertConfig.from_hf(hf, pooler=False)
    assert (config.d_model, config.num_layers, config.pooler) == (32, 2, False)
    with pytest.raises(CheckpointError, match=r"BERT config field\(s\) \['rope_wobble'\]"):
        BertConfig.from_hf({**hf, "rope_wobble": 1})
    with pytest.raises(CheckpointError, match="BERT is_decoder=True is not supported"):
        BertConfig.from_hf({**hf, "is_decoder": True})


@pytest.mark.parametrize("family", [MistralConfig, Qwen2Config, Qwen3Config, GemmaConfig])
@pytest.mark.parametrize("window", [0, -4, "64", True, 2.5])
def test_a_sliding_familys_window_is_a_positive_integer(family, window):
    """Every family with a window refuses one that is not a positive integer, naming it."""
    with pytest.raises(
        ValueError, match=f"attention_window must be a positive integer or None, got {window!r}"
    ):
        made(family, attention_window=window)
    assert made(family, attention_window=4).attention_window == 4
