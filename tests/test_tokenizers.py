"""Tokenizers: round trips, the fixed special ids, save/load, clear errors."""

import pytest

from glassformer.data.tokenizers import CharTokenizer, load_tokenizer, train_tokenizer

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "river",
    "mountain",
    "sings",
    "quietly",
]
CORPUS = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(8)) + "." for i in range(300)]


def test_char_round_trip_and_unknown_characters():
    tok = train_tokenizer("char", ["hello world"])
    assert tok.vocab_size == 4 + len(set("hello world"))
    ids = tok.encode("hello", add_bos=True, add_eos=True)
    assert ids[0] == tok.bos_id == 1 and ids[-1] == tok.eos_id == 2
    assert tok.decode(ids) == "hello"
    assert tok.encode("hez")[-1] == tok.unk_id == 3
    assert tok.pad_id == 0 and 0 not in tok.encode("hello world")


@pytest.mark.parametrize("kind", ["char", "bpe", "wordpiece"])
def test_save_and_load_give_the_same_encodings(kind, tmp_path):
    tok = train_tokenizer(kind, CORPUS, vocab_size=200)
    tok.save(tmp_path)
    again = load_tokenizer(tmp_path)
    assert type(again) is type(tok) and again.vocab_size == tok.vocab_size
    text = "the lazy fox sings over the river."
    assert again.encode(text) == tok.encode(text)
    assert (again.pad_id, again.bos_id, again.eos_id, again.unk_id) == (0, 1, 2, 3)


def test_byte_level_bpe_round_trips_any_text():
    tok = train_tokenizer("bpe", CORPUS, vocab_size=300)
    for text in ["the quick brown fox.", "Ünïcödé → ✓ 漢字", "  spaces\tand\nlines  "]:
        assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode("the quick brown fox")) < len("the quick brown fox")  # it merged


def test_wordpiece_round_trips_up_to_spacing():
    tok = train_tokenizer("wordpiece", CORPUS, vocab_size=300)
    assert tok.decode(tok.encode("the quick brown fox jumps.")) == "the quick brown fox jumps."
    assert tok.encode_batch(["the dog", "a river"]) == [
        tok.encode("the dog"),
        tok.encode("a river"),
    ]


def test_a_bert_vocab_txt_loads_with_its_own_special_ids(tmp_path):
    vocab = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "dog", "##s", "run"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = load_tokenizer(tmp_path / "vocab.txt")
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 2, 3, 4)
    assert tok.encode("The dogs run") == [6, 7, 8, 9]
    assert tok.encode("cat") == [2]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: train_tokenizer("sentencepiece", ["x"]), "'sentencepiece'"),
        (lambda: train_tokenizer("char", ["", ""]), "empty text"),
        (lambda: train_tokenizer("bpe", CORPUS, vocab_size=3), "got 3"),
    ],
)
def test_bad_training_requests(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_unreadable_tokenizer_files(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_tokenizer(tmp_path / "missing.json")
    (tmp_path / "tokenizer.json").write_text("{broken")
    with pytest.raises(ValueError, match="is not a tokenizer file"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "Unigram"}}')
    with pytest.raises(ValueError, match="'Unigram'"):
        load_tokenizer(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no tokenizer.json or vocab.txt"):
        load_tokenizer(tmp_path / "empty")


def test_char_tokenizer_decodes_tensors():
    import torch

    tok = CharTokenizer("abc")
    assert tok.decode(torch.tensor([1, 4, 5, 6, 2, 0, 0])) == "abc"
