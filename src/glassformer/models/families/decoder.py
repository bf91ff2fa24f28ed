"""What every decoder family shares: the fields, their rules, and what a family file adds.

A family is one file in this folder (``llama.py``, ``gemma.py``, ...). Each holds

- a frozen config of the family's own fields, subclassing ``DecoderConfig`` (the fields
  every decoder has) and naming itself with ``family`` (the key saved checkpoints carry);
- ``from_hf(config_dict)``: that config from a Hugging Face ``config.json`` (or a GGUF
  file's metadata read as one), refusing by name any field it does not know and any value
  it cannot build;
- ``parts()``: the keyword arguments of ``Backbone`` (embeddings, blocks, final norm), built
  from the modules in ``glassformer.modules``; and ``readout()`` where the head differs.

``GPT(config)`` runs any of them; the weight maps from a family's files live in ``interop/``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, TypeVar

from glassformer.checkpoint import CheckpointError
from glassformer.errors import shown
from glassformer.models.base import ConfigBase
from glassformer.models.checks import check_finite, fields_of, is_integer
from glassformer.modules.attention import check_dropout, check_heads
from glassformer.modules.rope_scaling import KINDS, RopeScaling

D = TypeVar("D", bound="FamilyConfig")

# family name → its config class (each family's class adds itself as it is defined)
FAMILIES: dict[str, type[FamilyConfig]] = {}

# Fields a transformers config.json may carry that do not change the model's numbers: its
# provenance, the special tokens, generation's defaults, training's initialisation and
# dropouts (glassformer reads for inference; dropout is 0 there).
HF_IGNORED = frozenset(
    [
        "_name_or_path",
        "_commit_hash",
        "_attn_implementation_autoset",
        "architectures",
        "attn_implementation",
        "transformers_version",
        "model_type",
        "dtype",
        "torch_dtype",
        "use_bfloat16",
        "use_cache",
        "torchscript",
        "tf_legacy_loss",
        "return_dict",
        "output_attentions",
        "output_hidden_states",
        "output_scores",
        "return_dict_in_generate",
        "chunk_size_feed_forward",
        "is_encoder_decoder",
        "is_decoder",
        "add_cross_attention",
        "cross_attention_hidden_size",
        "tie_encoder_decoder",
        "pruned_heads",
        "id2label",
        "label2id",
        "num_labels",
        "problem_type",
        "finetuning_task",
        "tokenizer_class",
        "prefix",
        "task_specific_params",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "num_return_sequences",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
        "initializer_range",
        "init_std",
        "initializer_factor",
        "classifier_dropout",
        "hidden_dropout",
        "attention_dropout",
        "dropout",
        "activation_dropout",
        "resid_pdrop",
        "embd_pdrop",
        "attn_pdrop",
        "layerdrop",
        "gradient_checkpointing",
        "cache_implementation",
        "is_llama_config",
        "classif_dropout",
        "output_past",
        "transformers.js_config",
    ]
)


# A sequence-summary head's fields, which transformers 4 wrote into every GPT-Neo and GPT-J
# config.json: no causal LM reads them.
SUMMARY_HEAD = frozenset(
    ["summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
     "summary_first_dropout"]
)  # fmt: skip


class Readout(NamedTuple):
    """How the final states become logits, where a family differs from a plain head:
    ``embed_width`` (the states projected to the embeddings' narrower width first, OPT-350m),
    ``softcap`` (logits = c·tanh(logits / c), Gemma's) and ``bias`` (a bias per token, Phi's)."""

    embed_width: int | None = None
    softcap: float | None = None
    bias: bool = False


class FamilyConfig(ConfigBase):
    """What a family's config is, decoder or translator: a frozen dataclass naming its
    ``family`` (the key its saved configs carry, registered in its kind's ``REGISTRY`` as
    the class is defined), the ``title`` its errors use, and the ``config.json`` fields its
    ``from_hf`` reads (``HF_READS``)."""

    REGISTRY: ClassVar[dict[str, type[FamilyConfig]]] = {}
    family: ClassVar[str] = ""
    title: ClassVar[str] = ""  # the family's name in messages ("Llama")
    HF_READS: ClassVar[frozenset[str]] = frozenset()  # the config.json fields from_hf reads

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "family" in cls.__dict__:
            cls.REGISTRY[cls.family] = cls

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, **dataclasses.asdict(self)}  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[D], values: dict[str, Any]) -> D:
        """The config ``values`` (``to_dict``'s) describe: its ``family``'s class."""
        registry = cls.REGISTRY
        family = values.get("family", cls.family)
        if family not in registry:
            raise ValueError(f"unknown model family {shown(family)}; known: {sorted(registry)}")
        target = registry[family]
        own = fields_of(target, {k: v for k, v in values.items() if k != "family"})
        return target(**own)  # type: ignore[return-value]

    @classmethod
    def check_hf_fields(cls, hf: dict[str, Any]) -> None:
        """Refuse the fields of ``hf`` this family neither reads nor knows to leave the
        numbers alone (``check_known_fields``)."""
        check_known_fields(cls.title, hf, cls.HF_READS)


def check_known_fields(title: str, hf: dict[str, Any], reads: frozenset[str]) -> None:
    """Refuse, naming them, the fields of the ``title`` family's ``hf`` that are neither in
    ``reads`` nor known to leave the numbers alone: a field glassformer does not know may
    change the model."""
    unknown = sorted(set(hf) - reads - HF_IGNORED)
    if unknown:
        raise CheckpointError(
            f"{title} config field(s) {shown(unknown)} are not known to glassformer, which "
            f"cannot tell whether they change the model; it reads {sorted(reads)}"
        )


@dataclass(frozen=True, kw_only=True)
class DecoderConfig(FamilyConfig):
    """The fields every decoder family has. A family subclasses it with its own fields
    and ``parts()``; ``DecoderConfig.from_dict`` reads any family's saved config back."""

    REGISTRY: ClassVar[dict[str, type[FamilyConfig]]] = FAMILIES

    vocab_size: int  # tokens in the vocabulary
    max_len: int = 2048  # the longest sequence (rotary angles are computed this far)
    d_model: int  # the residual stream's width
    num_heads: int  # query heads per layer
    num_kv_heads: int | None = None  # key/value heads (grouped-query); None: num_heads
    head_dim: int | None = None  # each head's width; None: d_model // num_heads
    num_layers: int
    d_ff: int  # the MLP's hidden width
    norm_eps: float = 1e-6  # every norm's epsilon
    tie_weights: bool = False  # the vocabulary head reads the token embedding
    dropout: float = 0.0  # on embeddings and sub-layer outputs (training only)
    attention_dropout: float = 0.0  # on the attention weights (training only)
    pad_id: int | None = None  # the padding token; None for vocabularies without one

    def __post_init__(self) -> None:
        self._check_sizes()
        check_heads(self.d_model, self.num_heads, self.head_dim)
        check_dropout(self.dropout)
        check_dropout(self.attention_dropout, "attention_dropout")
        kv = self.num_kv_heads
        if kv is not None and (not is_integer(kv) or kv <= 0 or self.num_heads % kv):
            raise ValueError(
                f"num_kv_heads must be a positive divisor of num_heads={self.num_heads}, "
                f"got {shown(kv)}"
            )
        if self.pad_id is not None and not (
            is_integer(self.pad_id) and 0 <= self.pad_id < self.vocab_size
        ):
            raise ValueError(f"pad_id={shown(self.pad_id)} is outside [0, {self.vocab_size})")
        check_finite("norm_eps", self.norm_eps, minimum=0.0)

    @property
    def width(self) -> int:
        """Each head's width."""
        return self.head_dim or self.d_model // self.num_heads

    def parts(self) -> dict[str, Any]:
        """The keyword arguments of ``Backbone``: the family's embeddings, blocks, norm."""
        raise NotImplementedError(f"{type(self).__name__} builds no parts")

    def readout(self) -> Readout:
        """How the head differs from a plain vocabulary projection (by default it does not)."""
        return Readout()


def refuse(family: str, field: str, value: Any, expected: str = "") -> CheckpointError:
    """One error: ``family``'s ``field`` has a value glassformer does not build."""
    wanted = f" ({expected})" if expected else ""
    return CheckpointError(f"{family} {field}={shown(value)} is not supported{wanted}")


def rope_theta(hf: dict[str, Any], family: str, default: float = 10000.0) -> float:
    """The rotary base of ``hf``, refusing any rope scaling (transformers 4's and 5's
    spellings): for the families that build none (a scaled rotary turns positions
    otherwise)."""
    theta, scaling = rope(hf, family, default)
    if scaling is not None:
        raise refuse(family, "rope_scaling rope_type", scaling.rope_type, "only the default")
    return theta


def scaling_field(value: Any, theta: float, width: int) -> RopeScaling | None:
    """A family config's ``rope_scaling``: a ``RopeScaling`` (or a saved config's dict of
    one) checked to turn ``width`` features with the base ``theta``, or None."""
    if isinstance(value, dict):
        value = RopeScaling.from_dict(value)
    if not isinstance(value, RopeScaling | None):
        raise ValueError(f"rope_scaling must be a RopeScaling or None, got {value!r}")
    if value is not None:
        value.check(theta, width)
    return value


# Hugging Face's rope scaling fields → RopeScaling's
_SCALING_FIELDS = {
    "factor": "factor", "original_max_position_embeddings": "original_max_len",
    "low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor",
    "beta_fast": "beta_fast", "beta_slow": "beta_slow", "mscale": "mscale",
    "mscale_all_dim": "mscale_all_dim", "attention_factor": "attention_factor",
    "truncate": "truncate", "short_factor": "short_factor", "long_factor": "long_factor",
    "factors": "factors",  # a GGUF file's rope_freqs (llama.cpp's)
}  # fmt: skip


def rope(
    hf: dict[str, Any], family: str, default: float = 10000.0
) -> tuple[float, RopeScaling | None]:
    """(the rotary base, its scaling or None) of ``hf``: transformers 5's ``rope_parameters``
    or 4's ``rope_scaling`` (``type`` or ``rope_type``) beside ``rope_theta``. A rope type or
    a field of it that glassformer does not know is refused by name."""
    # transformers takes a rope_scaling in place of rope_parameters, the base then from
    # rope_theta (or its default)
    raw = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    if not isinstance(raw, dict):
        raise refuse(family, "rope_scaling", raw, "a dict")
    spec = dict(raw)
    kind = spec.pop("rope_type", None) or spec.pop("type", None) or "default"
    spec.pop("type", None)
    theta = float(spec.pop("rope_theta", None) or hf.get("rope_theta") or default)
    spec.pop("partial_rotary_factor", None)  # the families that rotate part read it apart
    if kind == "default":
        return theta, None
    if kind not in KINDS:
        raise refuse(family, "rope_scaling rope_type", kind, f"one of {list(KINDS)}")
    unknown = sorted(set(spec) - set(_SCALING_FIELDS))
    if unknown:
        raise refuse(family, f"{kind} rope_scaling field(s)", unknown)
    values = {_SCALING_FIELDS[k]: v for k, v in spec.items() if v is not None}
    if hf.get("original_max_position_embeddings") is not None:  # Phi-3's: it wins
        values["original_max_len"] = hf["original_max_position_embeddings"]
    if kind in ("llama3", "yarn", "longrope"):
        values.setdefault("original_max_len", hf.get("max_position_embeddings"))
    try:
        return theta, RopeScaling(kind, max_len=hf.get("max_position_embeddings"), **values)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{family} rope_scaling: {e}") from None


def partial_rotary(hf: dict[str, Any], default: float = 1.0) -> float:
    """The fraction of each head rotary turns: the rope fields' ``partial_rotary_factor``
    (transformers 5 writes it there), else the top-level one, else ``default``."""
    spec = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    spec = spec if isinstance(spec, dict) else {}
    return spec.get("partial_rotary_factor", hf.get("partial_rotary_factor", default))


def turned_features(family: str, field: str, fraction: Any, head_dim: int) -> int | None:
    """The features of each head a rotary turning ``fraction`` of them turns, rounded down as
    transformers does (None: all of them); refused by ``field`` where not an even number ≥ 2."""
    rotary_dim = int(head_dim * fraction)
    if rotary_dim < 2 or rotary_dim % 2:
        turned = f"{rotary_dim} of {head_dim} features turned; needs an even number ≥ 2"
        raise refuse(family, field, fraction, turned)
    return None if rotary_dim == head_dim else rotary_dim


def window_from_sliding(family: str, sliding_window: Any) -> int | None:
    """Hugging Face's ``sliding_window`` W (each query sees W keys, itself included) as the
    keys before the query that glassformer's windows count: W − 1; None stays None."""
    if sliding_window is None:
        return None
    if not is_integer(sliding_window) or sliding_window < 2:
        raise refuse(family, "sliding_window", sliding_window, ">= 2")
    return int(sliding_window) - 1


def layer_windows(family: str, hf: dict[str, Any], default_types: list[str]) -> dict[str, Any]:
    """``attention_window`` and ``full_attention_layers`` of a config whose layers are each
    "sliding_attention" or "full_attention": its ``layer_types``, or ``default_types`` (the
    family's own pattern) where it has none."""
    types = hf.get("layer_types")
    types = default_types if types is None else types
    if len(types) != hf["num_hidden_layers"] or set(types) - {
        "sliding_attention",
        "full_attention",
    }:
        raise refuse(family, "layer_types", types)
    if "sliding_attention" not in types:
        return {"attention_window": None, "full_attention_layers": ()}
    return {
        "attention_window": window_from_sliding(family, hf.get("sliding_window")),
        "full_attention_layers": tuple(i for i, t in enumerate(types) if t == "full_attention"),
    }


def check_layers(field: str, layers: tuple[int, ...], num_layers: int) -> None:
    """``layers`` are layer indices of a ``num_layers``-layer stack."""
    if any(not is_integer(i) or not 0 <= i < num_layers for i in layers):
        raise ValueError(
            f"{field} must be layer indices in 0..{num_layers - 1}, got {shown(list(layers))}"
        )
