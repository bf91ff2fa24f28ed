"""Chat templates: a conversation rendered as the text a chat model was trained on.

A chat model's tokenizer carries a Jinja template (Hugging Face's ``chat_template``, GGUF's
``tokenizer.chat_template``) that turns a list of messages into one string, with the special
tokens that mark each turn. ``render_chat`` renders one the way ``transformers`` does: in a
sandboxed Jinja environment (the template comes from a file, so it must not reach Python),
blocks trimmed, with ``messages``, ``add_generation_prompt``, the special tokens and
``raise_exception`` in scope.

    render_chat(template, [{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    # '<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'  (a ChatML template)

The template is a downloaded file, so its rendering is bounded (``chat_sandbox``, with the
limits of ``chat_budget``): Jinja's sandbox keeps it from Python but not from looping for
ever or building a string of 10 GB. Every loop step, call, filter, operator, literal and
piece of output is counted against a time limit, a number of loop steps and a size: any value
the template makes, and the output, holds at most ``size_limit`` characters (counting a list
by what printing it would write). A template past a limit, or failing in any other way, is
one ``ChatTemplateError`` that names the template's file. Jinja older than 3.1.6, whose
sandbox a template can escape, is refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from importlib import metadata
from typing import Any

from glassformer.data.tokenizers import chat_budget, chat_sandbox
from glassformer.errors import ChatTemplateError, MissingDependencyError, one_line

ROLES = ("system", "user", "assistant")
# The first Jinja whose sandbox has no known escape: 3.1.5 fixed GHSA-q2x7-8rv6-6q7h (a
# stored str.format), 3.1.6 GHSA-cpwx-vrp4-4pq7 (|attr reaching str.format).
JINJA2_FIXED = (3, 1, 6)
MAX_TEMPLATE_CHARS = 100_000  # the longest published are ~20 000; compiling 100 000 takes ~2 s


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, str]],
    *,
    add_generation_prompt: bool = True,
    special_tokens: Mapping[str, str] | None = None,
    source: str | None = None,
) -> str:
    """The text of ``messages`` formatted by ``template``.

    Args:
        template: the Jinja chat template.
        messages: ``{"role": "system" | "user" | "assistant", "content": str}`` each.
        add_generation_prompt: end with the opening of an assistant turn, so that what the
            model writes next is the reply.
        special_tokens: names the template may use (``bos_token``, ``eos_token``, ...).
        source: the file the template came from, named in errors.

    Raises:
        ValueError: a message that is not a role and a string content.
        ChatTemplateError: a template that does not render (its own ``raise_exception``
            included) or passes a limit of ``chat_budget``, in one line naming ``source``.
        MissingDependencyError: Jinja is not installed, or is older than 3.1.6.
    """
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or m.get("role") not in ROLES:
            raise ValueError(f"message {i} must have a role in {ROLES}, got {m!r}")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} must have a string content, got {m.get('content')!r}")
    jinja2 = _require_jinja2()
    if len(template) > MAX_TEMPLATE_CHARS:
        problem = f"it has {len(template):,} characters, more than {MAX_TEMPLATE_CHARS:,}"
        raise ChatTemplateError(source, problem)
    tokens = dict(special_tokens or {})
    given = sum(len(m["content"]) for m in messages) + sum(len(str(t)) for t in tokens.values())
    context = {
        "messages": [dict(m) for m in messages],
        "add_generation_prompt": add_generation_prompt,
        **tokens,
    }
    try:
        return chat_sandbox.render(_compile(template), context, chat_budget.size_limit(given))
    except chat_budget.TemplateLimitError as e:
        raise ChatTemplateError(source, str(e)) from None
    except jinja2.TemplateError as e:
        raise ChatTemplateError(source, one_line(e, 300)) from None
    except Exception as e:  # RecursionError, MemoryError, ZeroDivisionError, ...
        detail = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        raise ChatTemplateError(source, one_line(detail, 300)) from None


@lru_cache(maxsize=8)
def _compile(template: str) -> Any:
    env = chat_sandbox.environment()
    env.globals["raise_exception"] = _raise
    return env.from_string(chat_sandbox.guard(env, env.parse(template)))


def _raise(message: str) -> None:
    import jinja2

    raise jinja2.TemplateError(message)


def _require_jinja2() -> Any:
    """Jinja, refused before 3.1.6: older sandboxes let a template reach Python."""
    try:
        import jinja2
    except ImportError:
        raise MissingDependencyError(
            "chat templates are rendered with Jinja: pip install jinja2"
        ) from None
    installed = _jinja2_version()
    if _release(installed) < JINJA2_FIXED:
        needed = ".".join(map(str, JINJA2_FIXED))
        raise MissingDependencyError(
            f"chat templates need jinja2 >= {needed} (older sandboxes let a template reach "
            f"Python), but jinja2 {installed} is installed: pip install -U 'jinja2>={needed}'"
        )
    return jinja2


@lru_cache(maxsize=1)
def _jinja2_version() -> str:
    return metadata.version("jinja2")


def _release(version: str) -> tuple[int, ...]:
    """``"3.1.6"`` → ``(3, 1, 6)``; a suffix (``rc1``) is ignored."""
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])
