"""Tokenizers: round trips, the special ids, save/load, foreign vocabularies, clear errors."""

import json
import os
import random
import re
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


@pytest.mark.parametrize("where", ["chat_template.jinja", "tokenizer_config.json"])
def test_a_loaded_template_that_does_not_render_names_its_file(chat_bpe, tmp_path, where):
    """From Python too (``tok.apply_chat_template``), not only from the CLI."""
    from glassformer.errors import ChatTemplateError

    folder = chat_bpe(tmp_path)
    hostile = "{% for a in range(99999) %}{% for b in range(99999) %}x{% endfor %}{% endfor %}"
    if where == "chat_template.jinja":
        (folder / where).write_text(hostile)
    else:
        (folder / where).write_text(json.dumps({"chat_template": hostile}))
    with pytest.raises(ChatTemplateError, match="does not render") as e:
        load_tokenizer(folder).apply_chat_template([{"role": "user", "content": "hi"}])
    assert str(folder / where) in str(e.value) and "\n" not in str(e.value)


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
    with pytest.raises(ValueError, match="tokenizer_config.json is not a tokenizer config: inv"):
        load_tokenizer(folder)


NESTED = "[" * 5000 + "]" * 5000  # past what Python's JSON parser takes: a RecursionError


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_json_nested_too_deeply_is_one_line_naming_the_file(chat_bpe, tmp_path, name):
    """Nested 5,000 deep, tokenizer.json (``_load_file``) or tokenizer_config.json
    (``_configure``) once ended the run in a RecursionError traceback."""
    folder = chat_bpe(tmp_path)
    (folder / name).write_text(NESTED)
    with pytest.raises(ValueError, match=r"is not a tokenizer (file|config): JSON nested too") as e:
        load_tokenizer(folder)
    assert str(folder / name) in str(e.value) and "\n" not in str(e.value)


def test_a_fifo_or_a_file_past_the_limit_is_never_read(chat_bpe, tmp_path, monkeypatch):
    """A FIFO as tokenizer.json is refused (never waited on), as tokenizer_config.json
    skipped as a missing one is; a chat template past its limit is refused unread."""
    from glassformer.data.tokenizers import make

    folder = chat_bpe(tmp_path)
    (folder / "tokenizer_config.json").unlink(missing_ok=True)
    os.mkfifo(folder / "tokenizer_config.json")
    load_tokenizer(folder)
    monkeypatch.setattr(make, "MAX_CONFIG_BYTES", 100)
    (folder / "chat_template.jinja").write_text("x" * 101)
    with pytest.raises(ValueError, match="chat_template.jinja is not a chat template: larger"):
        load_tokenizer(folder)
    (folder / "tokenizer.json").unlink()
    os.mkfifo(folder / "tokenizer.json")
    with pytest.raises(ValueError, match="tokenizer.json is not a regular file"):
        load_tokenizer(folder / "tokenizer.json")


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"chars": ["a", {"b": 1}]}, r"chars\[1\] is \{'b': 1\}, expected one character"),
        ({"chars": ["ab"]}, r"chars\[0\] is 'ab', expected one character"),
        ({"chars": ["a", None]}, r"chars\[1\] is None, expected one character"),
        ({"chars": [[["a"]]]}, r"chars\[0\] is \[\['a'\]\], expected one character"),
        ({"chars": ["a"], "lowercase": "no"}, "lowercase is 'no', expected true or false"),
    ],
    ids=["dict", "two-characters", "null", "list", "lowercase-string"],
)
def test_a_char_tokenizer_file_with_bad_chars_names_the_file_and_value(tmp_path, spec, message):
    """A dict in ``chars`` once raised ``TypeError: unhashable type`` (and a two-character
    string a ValueError naming no file) from ``CharTokenizer.__init__``."""
    file = tmp_path / "tokenizer.json"
    file.write_text(json.dumps({"type": "glassformer-char", "version": 1, **spec}))
    with pytest.raises(ValueError, match=message) as e:
        load_tokenizer(file)
    assert str(e.value).startswith(f"{file}: ")


def test_char_tokenizer_refuses_what_is_not_a_character_with_a_value_error():
    with pytest.raises(ValueError, match=r"single characters, got \{"):
        CharTokenizer(["a", {"b": 1}])


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
    # Read os.environ under jinja2 3.1.5 (GHSA-cpwx-vrp4-4pq7): |attr gave the raw str.format.
    environ = (
        '{{ ("{0.__globals__[__loader__].get_data.__globals__[_os].environ}"|attr("format"))'
        "(raise_exception) }}"
    )
    with pytest.raises(ValueError, match="does not render: access to attribute '__globals__'"):
        render_chat(environ, [])


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


# ---- chat templates: real ones render as transformers renders them; hostile ones are refused --

SMOLLM2_TEMPLATE = (  # SmolLM2-135M-Instruct's (its GGUF's tokenizer.chat_template)
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
QWEN2_TEMPLATE = SMOLLM2_TEMPLATE.replace(  # Qwen2-Instruct's: the same but its system line
    "a helpful AI assistant named SmolLM, trained by Hugging Face", "a helpful assistant."
)
QWEN3_STYLE_TEMPLATE = (  # Qwen3's opening (a namespace, a reversed loop, loop.index0) trimmed
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}\n"
    "    {%- set index = (messages|length - 1) - loop.index0 %}\n"
    "    {%- if ns.multi_step_tool and message.role == 'user' and not"
    " (message.content.startswith('<tool_response>')) %}\n"
    "        {%- set ns.multi_step_tool = false %}\n"
    "        {%- set ns.last_query_index = index %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- for message in messages %}\n"
    "    {%- if message.role == 'assistant' and loop.index0 > ns.last_query_index %}\n"
    "        {{- '<|im_start|>' ~ message.role ~ '\\n<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- else %}{{- '<|im_start|>' + message.role + '\\n' }}{%- endif %}\n"
    "    {{- message.content|trim + '<|im_end|>\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
GEMMA_TEMPLATE = (  # gemma-2-2b-it's
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}"
    "{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + "
    "message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{'<start_of_turn>model\\n'}}{% endif %}"
)
LLAMA3_TEMPLATE = (  # Meta-Llama-3-8B-Instruct's
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
CONVERSATIONS = [
    [{"role": "user", "content": "  Hi there  "}],
    [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "héllo 😀\n\tagain <tool_response>"},
    ],
    [{"role": "system", "content": "Short answers."}, {"role": "user", "content": "Hi"}],
]


@pytest.mark.parametrize(
    "template",
    [SMOLLM2_TEMPLATE, QWEN2_TEMPLATE, QWEN3_STYLE_TEMPLATE, GEMMA_TEMPLATE, LLAMA3_TEMPLATE],
    ids=["smollm2", "qwen2", "qwen3-style", "gemma", "llama3"],
)
def test_real_chat_templates_render_in_the_bounded_sandbox_as_transformers_does(
    chat_bpe, tmp_path, template
):
    transformers = pytest.importorskip("transformers")
    tok = load_tokenizer(chat_bpe(tmp_path))
    tok.chat_template, tok.bos_id, tok.eos_id = template, 1, 2
    reference = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok.backend, bos_token="<|im_start|>", eos_token="<|im_end|>"
    )
    for messages in CONVERSATIONS:
        for prompt in (True, False):
            try:
                theirs = reference.apply_chat_template(
                    messages, chat_template=template, tokenize=False, add_generation_prompt=prompt
                )
            except Exception as e:  # Gemma refuses a system message: so must we, in one line
                with pytest.raises(ValueError, match=str(e).split(": ")[-1]):
                    tok.apply_chat_template(messages, add_generation_prompt=prompt)
                continue
            assert tok.apply_chat_template(messages, add_generation_prompt=prompt) == theirs


HOSTILE_TEMPLATES = {  # each would hang or take gigabytes, or ended in a traceback
    "nested loops": (
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        "its loops ran more than 1,000,000 steps",
    ),
    "loops over a long string": (
        "{% set s = 'a' * 1000000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
        "its loops ran more than",
    ),
    "a string times 10**10": ("{{ 'a' * 10**10 }}", "'\\*' would hold more than"),
    "a power of 10**8 digits": ("{{ 10 ** 100000000 }}", "integer of more than 16,384 bits"),
    "a recursive macro": (
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "RecursionError: maximum recursion depth",
    ),
    "range(10**12)|list": ("{{ range(10**12)|list }}", "OverflowError: Range too big"),
    "a huge join": (
        "{{ range(100000)|map('string')|join('x' * 1000000) }}",
        "the join filter would hold more than",
    ),
    "a string doubled in a namespace": (
        "{% set ns = namespace(s='a') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}{{ ns.s|length }}",
        "'~' would hold more than",
    ),
    "a list doubled in a namespace": (
        "{% set ns = namespace(s=['a']) %}{% for i in range(200) %}{% set ns.s = [ns.s, ns.s] %}"
        "{% endfor %}{{ ns.s == ns.s[0] }}",
        "a value made would hold more than",
    ),
    "a {% set %} block of 10 GB": (
        "{% set x %}{% for i in range(100000) %}{{ 'y' * 100000 }}{% endfor %}{% endset %}",
        "what it wrote would hold more than",
    ),
    "|center(10**10)": ("{{ 'a'|center(10**10) }}", "the center filter was given a number past"),
    "str.center(10**10)": ("{{ 'a'.center(10**10) }}", "str.center was given a number past"),
    "str.replace('', ...)": (
        "{{ ('a' * 1000000).replace('', 'b' * 1000) }}",
        "str.replace would hold more than",
    ),
    "a format width": ("{{ '{:>999999999}'.format(1) }}", "str.format would hold more than"),
    "a % width": ("{{ '%999999999s' % 'x' }}", "'%' would hold more than"),
    "|indent of many lines": ("{{ ('\\n' * 100000)|indent(1000) }}", "the indent filter would"),
    "|tojson of a deep value": (
        "{% set ns = namespace(x=1) %}{% for i in range(500) %}{% set ns.x = [ns.x] %}{% endfor %}"
        "{{ ns.x|tojson(indent=100000) }}",
        "the tojson filter would hold more than",
    ),
    "a list of a namespace": (
        "{% set ns = namespace(x='a' * 1000000) %}{{ [ns] * 100000 }}",
        "what it wrote would hold more than",
    ),
    "10 GB of output": (
        "{% for i in range(100000) %}{{ 'z' * 100000 }}{% endfor %}",
        "what it wrote would hold more than",
    ),
    "a division by zero": ("{{ 1 / 0 }}", "ZeroDivisionError: division by zero"),
    "lipsum": ("{{ lipsum(10**6) }}", "'lipsum' is undefined"),
    "a template of 100 001 characters": ("x" * 100_001, "100,001 characters, more than 100,000"),
}


@pytest.mark.parametrize("template, problem", HOSTILE_TEMPLATES.values(), ids=HOSTILE_TEMPLATES)
def test_a_hostile_chat_template_is_refused_in_one_line_naming_its_file(template, problem):
    from glassformer.data.tokenizers.chat import render_chat
    from glassformer.errors import ChatTemplateError

    source = "model/tokenizer_config.json"
    with pytest.raises(ChatTemplateError) as caught:
        render_chat(template, [{"role": "user", "content": "hi"}], source=source)
    message = str(caught.value)
    assert message.startswith(f"{source}: the chat template does not render: ")
    assert re.search(problem, message) and "\n" not in message, message


EVERY_FEATURE = """\
{%- macro turn(m, n=0) -%}[{{ n }}:{{ m.role|upper }}]{{ caller() if caller }}{%- endmacro %}
{%- set ns = namespace(count=0, names=[]) %}
{%- for m in messages if m.role != 'system' -%}
  {{ loop.index }}/{{ loop.length }} {{ loop.revindex0 }} {{ loop.cycle('a', 'b') }}
  {%- if loop.first %} first{% endif %}{% if loop.last %} last{% endif %}
  {%- set ns.count = ns.count + m.content|length %}{% set ns.names = ns.names + [m.role] %}
  {%- call turn(m, loop.index0) %}{{ m.content|trim|replace('a', 'A') }}{% endcall %}
  {%- set block %}{% filter upper %}{{ m.role ~ '-' ~ m.content[:3] }}{% endfilter %}{% endset %}
  {{ block }} {{ '%s=%d' % (m.role, loop.index) }} {{ '{}|{:>5}'.format(m.role, 7) }}
{% else %}none
{% endfor -%}
{%- for a, b in [(1, 'x'), (2, 'y')] %}{{ a * 2 }}{{ b * 3 }}{{ 2 ** 10 }}{% endfor %}
{{ ns.count }} {{ ns.names|join(',') }} {{ {'k': [1, 2], 'j': none}|tojson }}
{{ messages|map(attribute='role')|unique|list }}
{{ messages|selectattr('role', 'eq', 'user')|list|length }}
{{ 'line1\nline2'|indent(2, true) }} {{ 'x'|center(9) }}
{{ range(3)|sum }} {{ [[1], [2]]|sum(start=[]) }}
{{ 'a,b'.split(',') }} {{ 'ab'.join(['1', '2', '3']) }} {{ 7 in (1, 7) }} {{ 'Ü'|lower }}
{%- for item in [{'c': [{'c': []}]}, {'c': []}] recursive %}
<{{ loop.depth }}{{ loop(item.c) }}>{% endfor %}
"""


def test_the_bounded_sandbox_renders_what_jinjas_sandbox_renders():
    """Every construct a template may use (loops and their state, macros and caller, blocks,
    filters, operators, literals, recursion): the same text as Jinja's own sandbox."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from glassformer.data.tokenizers.chat import render_chat

    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": " banana "},
        {"role": "assistant", "content": "apple"},
    ]
    jinja = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    theirs = jinja.from_string(EVERY_FEATURE).render(messages=messages, add_generation_prompt=1)
    assert render_chat(EVERY_FEATURE, messages, add_generation_prompt=1) == theirs
    assert "1/2 1 a first" in theirs and "none" not in theirs  # it exercised what it says


def test_a_chat_template_past_the_time_limit_is_refused(monkeypatch):
    from glassformer.data.tokenizers import chat_budget
    from glassformer.data.tokenizers.chat import render_chat

    monkeypatch.setattr(chat_budget, "MAX_LOOP_STEPS", 10**12)
    monkeypatch.setattr(chat_budget, "MAX_SECONDS", 0.2)
    nested = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
    with pytest.raises(ValueError, match="does not render: it ran for more than 0.2 s"):
        render_chat(nested, [])


def test_a_memory_error_while_rendering_is_one_line(monkeypatch):
    """Whatever slips past the limits (here a MemoryError from a filter) is one line too."""
    from glassformer.data.tokenizers import chat_sandbox
    from glassformer.data.tokenizers.chat import render_chat

    def exhausted(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setitem(chat_sandbox.environment().filters, "upper", exhausted)
    with pytest.raises(ValueError, match=r"^f: the chat template does not render: MemoryError$"):
        render_chat("{{ 'a'|upper }}", [], source="f")


def test_the_size_limit_grows_with_the_conversation():
    """A long conversation renders (the limit is 1 MiB plus 4 × its length), and so does a
    template that writes each message twice."""
    from glassformer.data.tokenizers.chat import render_chat

    twice = "{% for m in messages %}{{ m['content'] ~ m['content'] }}{% endfor %}"
    long = [{"role": "user", "content": "x" * 3_000_000}]
    assert len(render_chat(twice, long)) == 6_000_000


def test_chat_templates_refuse_a_jinja2_whose_sandbox_can_be_escaped(monkeypatch):
    """Jinja before 3.1.6 lets a template reach Python (GHSA-q2x7-8rv6-6q7h fixed in 3.1.5,
    GHSA-cpwx-vrp4-4pq7 in 3.1.6): refused in one line saying what is installed and needed."""
    from glassformer.data.tokenizers import chat

    monkeypatch.setattr(chat, "_jinja2_version", lambda: "3.1.5")
    with pytest.raises(MissingDependencyError) as caught:
        chat.render_chat(CHATML, [{"role": "user", "content": "hi"}])
    assert "need jinja2 >= 3.1.6" in str(caught.value) and "jinja2 3.1.5 is installed" in str(
        caught.value
    )
    assert "\n" not in str(caught.value)
    monkeypatch.setattr(chat, "_jinja2_version", lambda: "3.1.6")
    assert chat.render_chat(CHATML, [{"role": "user", "content": "hi"}]).startswith("<|im_start|>")


@pytest.mark.parametrize("kind", ["fifo", "too large", "not utf-8"])
def test_a_vocab_txt_is_read_within_bounds_or_refused_in_one_line(tmp_path, monkeypatch, kind):
    """A BERT vocab.txt that is a FIFO (read whole, it waited forever), past the size
    limit, or not UTF-8: one ValueError naming the file, nothing read past the limit."""
    from glassformer.data.tokenizers import subword

    vocab = tmp_path / "vocab.txt"
    if kind == "fifo":
        os.mkfifo(vocab)
        message = "not a regular file"
    elif kind == "too large":
        vocab.write_text("[UNK]\n" + "word\n" * 100)
        monkeypatch.setattr(subword, "MAX_VOCAB_BYTES", 64)
        message = "larger than 64 bytes"
    else:
        vocab.write_bytes(b"[UNK]\n\xff\xfe\n")
        message = "is not UTF-8 text"
    with pytest.raises(ValueError, match=message) as e:
        WordPieceTokenizer.from_vocab(vocab)
    assert str(vocab) in str(e.value) and "\n" not in str(e.value)
