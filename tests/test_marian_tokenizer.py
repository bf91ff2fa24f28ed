"""Marian's SentencePiece tokenizer (glassformer.data.tokenizers.marian): the same ids as
transformers' MarianTokenizer on the same files, text back from ids, and a Marian directory
translated from the command line (`glassformer translate`) as transformers translates it."""

import json

import pytest
import torch

spm = pytest.importorskip("sentencepiece")
transformers = pytest.importorskip("transformers")

from glassformer.cli import main  # noqa: E402
from glassformer.data.tokenizers import load_tokenizer  # noqa: E402
from glassformer.data.tokenizers.marian import MarianTokenizer  # noqa: E402

SENTENCES = [
    "The cat sat on the mat.",
    "A dog barks at the moon, and the cat runs away.",
    "Where is the station?",
    "Der Hund bellt den Mond an.",
]


@pytest.fixture(scope="module")
def marian_files(tmp_path_factory):
    """A small SentencePiece model (unigram, as Marian's) trained here, written as a Marian
    directory's source.spm, target.spm and vocab.json."""
    folder = tmp_path_factory.mktemp("marian")
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES * 30), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(folder / "sp"), vocab_size=40, model_type="unigram",
        character_coverage=1.0, bos_id=-1, eos_id=-1, unk_id=0,
    )  # fmt: skip
    for side in ("source", "target"):
        (folder / f"{side}.spm").write_bytes((folder / "sp.model").read_bytes())
    processor = spm.SentencePieceProcessor(model_file=str(folder / "sp.model"))
    pieces = [processor.id_to_piece(i) for i in range(1, processor.get_piece_size())]
    vocab = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(pieces)}}
    vocab["<pad>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    return folder


def test_the_ids_equal_transformers_marian_tokenizer(marian_files):
    ours = load_tokenizer(marian_files)
    theirs = transformers.MarianTokenizer(
        source_spm=str(marian_files / "source.spm"), target_spm=str(marian_files / "target.spm"),
        vocab=str(marian_files / "vocab.json"),
    )  # fmt: skip
    assert isinstance(ours, MarianTokenizer)
    assert (ours.eos_id, ours.pad_id, ours.unk_id) == (0, theirs.pad_token_id, 1)
    for text in [*SENTENCES, "Unseen wörds: ζ!"]:
        ids = ours.encode(text)
        assert ids == theirs(text).input_ids, text
        assert ids[-1] == ours.eos_id
    for text in SENTENCES:
        assert ours.decode(ours.encode(text)) == text


def test_a_marian_directory_translates_from_the_command_line(marian_files, tmp_path, capsys):
    """`glassformer translate` on a Marian directory (model and tokenizer files) prints what
    transformers' MarianMTModel.generate gives on the same files, greedy."""
    from hf_families import randomize

    vocab = json.loads((marian_files / "vocab.json").read_text())
    pad = vocab["<pad>"]
    config = transformers.MarianConfig(
        vocab_size=len(vocab), d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=pad,
        decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=None, dropout=0.0,
        activation_function="swish", scale_embedding=True,
    )  # fmt: skip
    hf = transformers.MarianMTModel(config).eval()
    randomize(hf, keep=("embed_positions",))
    folder = tmp_path / "opus-mt-tiny"
    hf.save_pretrained(folder)
    for name in ("source.spm", "target.spm", "vocab.json"):
        (folder / name).write_bytes((marian_files / name).read_bytes())
    tokenizer = transformers.MarianTokenizer(
        source_spm=str(folder / "source.spm"), target_spm=str(folder / "target.spm"),
        vocab=str(folder / "vocab.json"),
    )  # fmt: skip
    text = SENTENCES[0]
    src = torch.tensor([tokenizer(text).input_ids])
    budget = int(src.size(1) * 1.5) + 10  # what `translate` gives a sentence
    out = hf.generate(src, max_new_tokens=budget, num_beams=1, do_sample=False,
                      bad_words_ids=[[pad]])  # fmt: skip
    expected = tokenizer.decode(out[0], skip_special_tokens=True)
    assert out.size(1) > 5 and expected  # many tokens, however random the weights
    assert main(["translate", "--model", str(folder), "--dtype", "fp32", text]) == 0
    assert capsys.readouterr().out.strip() == expected.strip()
