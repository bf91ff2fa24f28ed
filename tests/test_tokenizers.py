"""Tokenizers: round trips, the special ids, save/load, foreign vocabularies, clear errors."""

import json
import random
import sys

import pytest
import torch

from glassformer.data.tokenizers import (
    BPETokenizer,
    CharTokenizer,
    MissingDependencyError,
    WordPieceTokenizer,
    load_tokenizer,
    train_tokenizer,
)

tk = pytest.importorskip("tokenizers")


def make_corpus(n: int = 400) -> list[str]:
    """A few hundred varied sentences, made up from a small grammar."""
    rng = random.Random(0)
    subjects = ["the fox", "a river", "my neighbour", "the old dog", "every student", "she"]
    verbs = ["jumps over", "sings about", "quietly watches", "remembers", "walks past"]
    objects = ["the lazy dog", "a mountain", "the bridge", "her garden", "the cold sea"]
    ends = [".", "!", "?", ", again.", " (twice)."]
    out = []
    for _ in range(n):
        sentence = f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}"
        if rng.random() < 0.5:
            sentence = sentence.capitalize()
        out.append(sentence + rng.choice(ends))
    return out


CORPUS = make_corpus()
KINDS = ["char", "bpe", "wordpiece"]


@pytest.fixture(scope="module")
def trained():
    return {kind: train_tokenizer(kind, CORPUS, vocab_size=400) for kind in KINDS}


def test_char_round_trip_and_unknown_characters():
    tok = train_tokenizer("char", ["hello world"])
    assert isinstance(tok, CharTokenizer) and tok.kind == "char"
    assert tok.vocab_size == 4 + len(set("hello world"))
    ids = tok.encode("hello", add_bos=True, add_eos=True)
    assert ids[0] == tok.bos_id == 1 and ids[-1] == tok.eos_id == 2
    assert tok.decode(ids) == "hello" and tok.decode(ids[1:-1]) == "hello"
    assert tok.encode("hez")[-1] == tok.unk_id == 3
    assert tok.decode(tok.encode("hez")) == "he\ufffd"
    assert tok.pad_id == 0 and min(tok.encode("hello world")) == 4
    assert tok.decode([1, 4, 3, 2, 0], skip_special=False) == "<bos> <unk><eos><pad>"


def test_char_tokenizer_decodes_tensors_and_lowercases():
    tok = CharTokenizer("abc")
    assert tok.decode(torch.tensor([1, 4, 5, 6, 2, 0, 0])) == "abc"
    lower = train_tokenizer("char", ["Hello World"], lowercase=True)
    assert lower.encode("HELLO") == lower.encode("hello")
    assert lower.decode(lower.encode("Hello")) == "hello"


@pytest.mark.parametrize("kind", KINDS)
def test_trained_tokenizers_fix_the_special_ids(trained, kind):
    tok = trained[kind]
    assert tok.kind == kind
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    ids = tok.encode("the fox sings", add_bos=True, add_eos=True)
    assert ids[0] == 1 and ids[-1] == 2 and 0 not in ids
    assert all(4 <= i < tok.vocab_size for i in ids[1:-1])
    assert tok.encode_batch(["the fox", "a river."], add_eos=True) == [
        tok.encode("the fox", add_eos=True),
        tok.encode("a river.", add_eos=True),
    ]


def test_byte_level_bpe_round_trips_any_text(trained):
    tok = trained["bpe"]
    assert isinstance(tok, BPETokenizer)
    for text in [*CORPUS[:20], "Ünïcödé → ✓ 漢字 🙂", "  spaces\tand\nlines  ", ""]:
        assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(CORPUS[0])) < len(CORPUS[0]) / 2  # it learned merges
    assert tok.unk_id not in tok.encode("Ünïcödé → ✓ 漢字")  # bytes, never unknown


def test_wordpiece_round_trips_up_to_spacing(trained):
    tok = trained["wordpiece"]
    assert isinstance(tok, WordPieceTokenizer) and tok.mask_id == 4
    for text in CORPUS[:50]:
        assert tok.decode(tok.encode(text)).replace(" ", "") == text.replace(" ", "")
    assert tok.decode(tok.encode("the fox remembers the bridge.")) == (
        "the fox remembers the bridge."
    )
    assert tok.encode("жук") == [tok.unk_id]  # Cyrillic never occurs in the corpus


@pytest.mark.parametrize("kind", KINDS)
def test_save_and_load_give_the_same_encodings(trained, kind, tmp_path):
    tok = trained[kind]
    written = tok.save(tmp_path / "run")
    assert written == tmp_path / "run" / "tokenizer.json"
    assert [p.name for p in written.parent.iterdir()] == ["tokenizer.json"]  # no temp left
    again = load_tokenizer(tmp_path / "run")
    assert type(again) is type(tok) and again.vocab_size == tok.vocab_size
    assert again.encode_batch(CORPUS) == tok.encode_batch(CORPUS)
    assert (again.pad_id, again.bos_id, again.eos_id, again.unk_id) == (0, 1, 2, 3)
    assert load_tokenizer(written).encode(CORPUS[0]) == tok.encode(CORPUS[0])


def test_a_bert_vocab_txt_loads_with_its_own_special_ids(tmp_path):
    vocab = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "dog", "##s", "run"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, WordPieceTokenizer) and tok.vocab_size == len(vocab)
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id, tok.mask_id) == (0, 2, 3, 4, 5)
    assert tok.encode("The dogs run") == [6, 7, 8, 9]  # uncased: lower-cased first
    assert tok.encode("cat", add_bos=True, add_eos=True) == [3, 2, 4]
    assert tok.decode([3, 6, 7, 8, 4, 0]) == "the dogs"


def test_a_cased_vocab_txt_keeps_case(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "The", "the", "dog"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = load_tokenizer(tmp_path / "vocab.txt")
    assert tok.encode("The the dog") == [4, 5, 6]


def test_a_bert_tokenizer_json_loads_with_its_own_special_ids(tmp_path):
    """The layout Hugging Face's BertTokenizerFast saves: specials at 0 and 100..103."""
    vocab = {"[PAD]": 0, **{f"[unused{i}]": i + 1 for i in range(99)}}
    vocab |= {"[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103, "hello": 104}
    vocab |= {"world": 105, "##s": 106}
    backend = tk.Tokenizer(tk.models.WordPiece(vocab, unk_token="[UNK]"))
    backend.normalizer = tk.normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
    backend.decoder = tk.decoders.WordPiece()
    backend.post_processor = tk.processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 101), ("[SEP]", 102)]
    )
    backend.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    backend.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(tmp_path)
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id, tok.mask_id) == (0, 101, 102, 100, 103)
    assert tok.encode("Hello worlds") == [104, 105, 106]  # no [CLS]/[SEP] unless asked
    assert tok.encode("Hello", add_bos=True, add_eos=True) == [101, 104, 102]
    assert tok.decode([101, 104, 105, 102, 0]) == "hello world"


def test_a_gpt2_style_bpe_borrows_endoftext_for_its_specials(tmp_path):
    backend = tk.Tokenizer(tk.models.BPE(vocab={"!": 0, "a": 1, "<|endoftext|>": 2}, merges=[]))
    backend.add_special_tokens(["<|endoftext|>"])
    backend.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(tmp_path / "tokenizer.json")
    assert isinstance(tok, BPETokenizer)
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (2, 2, 2, 2)


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: train_tokenizer("sentencepiece", ["x"]),
            r"'sentencepiece'; choose one of \['char', 'bpe', 'wordpiece'\]",
        ),
        (lambda: train_tokenizer("char", ["", ""]), "empty text"),
        (lambda: train_tokenizer("bpe", []), "empty text"),
        (lambda: train_tokenizer("bpe", CORPUS, vocab_size=3), "got 3"),
        (lambda: CharTokenizer("abc").decode([7]), "cannot decode id 7: .* ids 0..6"),
    ],
)
def test_bad_requests(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_unreadable_tokenizer_files(tmp_path):
    with pytest.raises(ValueError, match="missing.json does not exist"):
        load_tokenizer(tmp_path / "missing.json")
    file = tmp_path / "tokenizer.json"
    cases = [
        ("{broken", "is not a tokenizer file: invalid JSON"),
        ("[1, 2]", "is not a tokenizer file: expected a JSON object"),
        ('{"model": {"type": "Unigram"}}', "model type 'Unigram'"),
        ('{"model": {"type": "BPE"}}', "glassformer can read: "),
        ('{"type": "glassformer-char", "version": 7, "chars": ["a"]}', "version 7"),
    ]
    for content, message in cases:
        file.write_text(content)
        with pytest.raises(ValueError, match=message) as e:
            load_tokenizer(tmp_path)
        assert str(file) in str(e.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no tokenizer.json or vocab.txt"):
        load_tokenizer(tmp_path / "empty")
    (tmp_path / "vocab.txt").write_text("hello\nworld\n")
    with pytest.raises(ValueError, match="has no \\[UNK\\] token"):
        load_tokenizer(tmp_path / "vocab.txt")


def test_without_the_tokenizers_package_characters_still_work(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # makes `import tokenizers` fail
    tok = train_tokenizer("char", CORPUS)
    tok.save(tmp_path)
    assert load_tokenizer(tmp_path).encode("the fox") == tok.encode("the fox")
    for kind in ("bpe", "wordpiece"):
        with pytest.raises(MissingDependencyError, match=r"pip install 'glassformer\[data\]'"):
            train_tokenizer(kind, CORPUS)
    assert issubclass(MissingDependencyError, ImportError)
    assert issubclass(MissingDependencyError, ValueError)  # the CLI prints it in one line


def test_the_char_file_is_readable_json(tmp_path):
    path = CharTokenizer("ba").save(tmp_path / "tok.json")
    assert json.loads(path.read_text()) == {
        "type": "glassformer-char",
        "version": 1,
        "chars": ["a", "b"],
    }


# --- tokenizer_config.json: special tokens chosen by a model, and its chat template ---------

CHATML = (
    "{% for m in messages %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_tokenizer_config_beside_tokenizer_json_sets_specials_and_chat_template(chat_bpe, tmp_path):
    folder = chat_bpe(tmp_path)
    plain = load_tokenizer(folder)
    assert (plain.bos_id, plain.eos_id, plain.chat_template) == (0, 0, None)  # by name
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": {"content": "<|im_start|>", "special": True},  # either form
                "eos_token": "<|im_end|>",
                "pad_token": None,  # unset: keeps the one by name
                "chat_template": [{"name": "default", "template": CHATML}],
            }
        )
    )
    tok = load_tokenizer(folder)
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 0)
    assert tok.chat_template == CHATML
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.encode(text)[0] == 1 and tok.decode(tok.encode(text), skip_special=False) == text


def test_a_chat_template_jinja_file_is_read_too(chat_bpe, tmp_path):
    folder = chat_bpe(tmp_path)
    (folder / "chat_template.jinja").write_text(CHATML)
    assert load_tokenizer(folder).chat_template == CHATML


def test_save_keeps_specials_and_template_and_a_plain_save_drops_a_stale_config(chat_bpe, tmp_path):
    tok = load_tokenizer(chat_bpe(tmp_path / "hf"))
    tok.bos_id, tok.eos_id, tok.chat_template = 1, 2, CHATML
    tok.save(tmp_path / "run")
    config = json.loads((tmp_path / "run" / "tokenizer_config.json").read_text())
    assert config == {
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "chat_template": CHATML,
    }
    again = load_tokenizer(tmp_path / "run")
    assert (again.bos_id, again.eos_id, again.pad_id, again.chat_template) == (1, 2, 0, CHATML)
    load_tokenizer(chat_bpe(tmp_path / "plain")).save(tmp_path / "run")  # nothing to keep
    assert not (tmp_path / "run" / "tokenizer_config.json").exists()
    assert load_tokenizer(tmp_path / "run").eos_id == 0


@pytest.mark.parametrize(
    "config, message",
    [
        ({"eos_token": "<|nope|>"}, "eos_token '<|nope|>' is not in the vocabulary"),
        ({"chat_template": 3}, "chat_template must be a string"),
    ],
)
def test_a_bad_tokenizer_config_is_one_line(chat_bpe, tmp_path, config, message):
    folder = chat_bpe(tmp_path)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        load_tokenizer(folder)
    (folder / "tokenizer_config.json").write_text("{oops")
    with pytest.raises(ValueError, match="tokenizer_config.json is not valid JSON"):
        load_tokenizer(folder)


def test_chat_without_a_template_or_with_bad_messages_is_one_line(trained):
    with pytest.raises(ValueError, match="no chat template"):
        trained["bpe"].apply_chat_template([{"role": "user", "content": "hi"}])
    from glassformer.data.tokenizers.chat import render_chat

    with pytest.raises(ValueError, match="message 0 must have a role"):
        render_chat(CHATML, [{"role": "robot", "content": "hi"}])
    with pytest.raises(ValueError, match="message 1 must have a string content"):
        render_chat(CHATML, [{"role": "user", "content": "a"}, {"role": "user", "content": 1}])
    raising = "{{ raise_exception('only user and assistant roles are supported') }}"
    with pytest.raises(ValueError, match="does not render: only user and assistant"):
        render_chat(raising, [])


def test_a_chat_template_cannot_reach_python():
    """Templates come from downloaded files: the sandbox refuses attribute tricks."""
    from glassformer.data.tokenizers.chat import render_chat

    escape = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(ValueError, match="does not render"):
        render_chat(escape, [])


def test_chat_rendering_equals_transformers_apply_chat_template(chat_bpe, tmp_path):
    transformers = pytest.importorskip("transformers")
    tok = load_tokenizer(chat_bpe(tmp_path))
    tok.chat_template = (  # a template that uses the special tokens and loop state
        "{{ bos_token }}{% for m in messages %}{% if loop.first and m['role'] != 'system' %}"
        "{{ '<|im_start|>system\\nBe kind.<|im_end|>\\n' }}{% endif %}"
        "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] | trim + '<|im_end|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
        "{{ eos_token if not add_generation_prompt }}"
    )
    tok.bos_id, tok.eos_id = 1, 2
    reference = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok.backend, bos_token="<|im_start|>", eos_token="<|im_end|>"
    )
    conversations = [
        [{"role": "user", "content": "  Hi there  "}],
        [
            {"role": "system", "content": "Short answers."},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "héllo 😀\n\tagain"},
        ],
    ]
    for messages in conversations:
        for prompt in (True, False):
            theirs = reference.apply_chat_template(
                messages,
                chat_template=tok.chat_template,
                tokenize=False,
                add_generation_prompt=prompt,
            )
            assert tok.apply_chat_template(messages, add_generation_prompt=prompt) == theirs
