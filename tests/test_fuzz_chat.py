"""Fuzzing chat templates (issue 49): templates composed from real ones (ChatML,
SmolLM2's, Llama 3's, Gemma's, Mistral's) and hostile Jinja pieces (nested loops, big
ranges, string and list multiplication, huge powers and paddings, recursion through macros
and recursive loops, attribute access to ``__class__`` / ``__globals__``, includes, syntax
errors, deep nesting, the template's own ``raise_exception``), wrapped in loops and macros,
put in a tokenizer folder's ``tokenizer_config.json`` and rendered as ``glassformer chat``
does (``load_tokenizer(folder).apply_chat_template(messages)``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from fuzzing import fuzz, one_in, register, session, stage
from hypothesis import strategies as st
from test_fuzz_json import mutate_file

FAST, SLOW = 80, 400
TOKENIZER = Path(__file__).parent / "data" / "runs_7a7e08c" / "runs" / "translate" / "checkpoint"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi {{ 7 * 7 }} {% raw %}"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Bye"},
]
REAL = [
    # ChatML (Qwen, SmolLM's base)
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    # SmolLM2-135M-Instruct's (from its GGUF file)
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}",
    # Llama 3's shape
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + "
    "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}",
    # Gemma's shape (no system role: its own raise_exception)
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'assistant' %}"
    "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}",
    # Mistral's shape
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token }}{% endif %}{% endfor %}",
]
HOSTILE = [
    "{% for a in range(N) %}{% for b in range(N) %}{{ a }}{% endfor %}{% endfor %}",
    "{{ 'x' * N }}",
    "{{ ('x' * 1000) * N }}",
    "{{ messages * N }}",
    "{{ range(N) | list | length }}",
    "{{ range(N) | join(',') }}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(N) }}",
    "{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}",
    "{{ 10 ** 10 ** 10 }}",
    "{{ 2 ** N }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.environ }}",
    "{{ joiner.__init__.__globals__ }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ lipsum.__globals__['os'].popen('id').read() }}",
    "{{ raise_exception.__globals__ }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ self.__dict__ }}",
    "{{ messages | map(attribute='__class__') | list }}",
    "{{ 'abc' | attr('__class__') }}",
    "{% set ns = namespace(a=[]) %}{% for i in range(N) %}{% set ns.a = ns.a + [i] %}{% endfor %}",
    "{{ '%s' % ('x' * N) }}",
    "{{ '{:>N}'.format(1) }}",
    "{{ '%Nd' % 1 }}",
    "{{ 'x' | center(N) }}",
    "{{ messages | tojson(indent=N) }}",
    "{{ 'x' | indent(N) }}",
    "{{ messages | batch(N) | list }}",
    "{{ messages | slice(0) | list }}",
    "{{ '%c' % 1114112 }}",
    "{{ 1 / 0 }}",
    "{{ (10 ** 400) | float }}",
    "{% include 'other' %}",
    "{% extends 'base' %}",
    "{% import 'x' as y %}",
    "{{ raise_exception('stop') }}",
    "{{ raise_exception('two\\nlines') }}",
    "{{ raise_exception('x' * N) }}",
    "{% if %}",
    "{{",
    "{% for %}",
    "{% endfor %}",
    "{{ 1 + }}",
    "{{ undefined_thing.attribute }}",
    "{{ messages[N] }}",
    "\x00{{ '\ud800' }}",
]
SIZES = [1, 10, 1000, 10**5, 10**6, 10**9]


def _piece(data: Any, depth: int = 0) -> str:
    """A real template, a hostile piece, or one of them inside a loop or a macro."""
    how = data.draw(st.sampled_from(["real", "hostile", "hostile", "loop", "macro", "deep"]))
    n = str(data.draw(st.sampled_from(SIZES), label="N"))
    if how == "real" or (depth > 1 and how in ("loop", "macro")):
        return data.draw(st.sampled_from(REAL), label="real")
    if how == "hostile":
        return data.draw(st.sampled_from(HOSTILE), label="piece").replace("N", n)
    if how == "loop":
        return f"{{% for _ in range({n}) %}}{_piece(data, depth + 1)}{{% endfor %}}"
    if how == "macro":
        macro = f"{{% macro m() %}}{_piece(data, depth + 1)}{{% endmacro %}}"
        return macro + f"{{% for _ in range({n}) %}}{{{{ m() }}}}{{% endfor %}}"
    depth_n = data.draw(st.sampled_from([10, 200, 2000]), label="depth")
    shape = data.draw(st.sampled_from(["parens", "ifs", "lists"]), label="deep")
    return {"parens": "{{ " + "(" * depth_n + "1" + ")" * depth_n + " }}",
            "ifs": "{% if true %}" * depth_n + "x" + "{% endif %}" * depth_n,
            "lists": "{{ " + "[" * depth_n + "]" * depth_n + " }}"}[shape]  # fmt: skip


def make_case(data: Any, folder: Path) -> tuple[str, None]:
    """A tokenizer folder whose tokenizer_config.json holds a composed template (now and
    then the config itself mutated as JSON)."""
    pieces = [_piece(data) for _ in range(data.draw(st.integers(1, 3), label="pieces"))]
    template = "".join(pieces)
    case = folder / "case"
    case.mkdir()
    _folder(case, template)
    what = f"template {template[:300]!r} ({len(template)} chars)"
    if one_in(data, 10, "config"):
        what += "; " + mutate_file(data, case / "tokenizer_config.json")
    return what, None


def render(case: Path) -> None:
    """``glassformer chat``: the tokenizer, its template, a conversation rendered."""
    from glassformer.data.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(case)
    stage("render")
    tokenizer.apply_chat_template(MESSAGES)


CHAT = register("chat template", render, names_file=False)


@pytest.fixture(scope="module")
def fuzzer(request, tmp_path_factory):
    return session(request, tmp_path_factory)


def _folder(case: Path, template: str) -> None:
    """A tokenizer folder whose tokenizer_config.json holds ``template``."""
    shutil.copy(TOKENIZER / "tokenizer.json", case)
    config = {"bos_token": "<bos>", "eos_token": "<eos>", "chat_template": template}
    (case / "tokenizer_config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def real_templates_render(fuzzer) -> None:
    """The real templates render (Gemma's refuses a system turn by its raise_exception)."""
    for template in REAL:
        result = fuzzer.try_seed(CHAT, lambda case: _folder(case, template))  # noqa: B023
        gemma = "alternate" in template
        assert result["outcome"] == ("refused" if gemma else "loaded"), result


def test_fuzzed_chat_templates_render_or_are_refused_in_one_line(fuzzer, real_templates_render):
    fuzz(fuzzer, CHAT, make_case, FAST)


@pytest.mark.slow
def test_fuzzed_chat_templates_many(fuzzer, real_templates_render):
    fuzz(fuzzer, CHAT, make_case, SLOW)
