"""Chat templates: a conversation rendered as the text a chat model was trained on.

A chat model's tokenizer carries a Jinja template (Hugging Face's ``chat_template``, GGUF's
``tokenizer.chat_template``) that turns a list of messages into one string, with the special
tokens that mark each turn. ``render_chat`` renders one the way ``transformers`` does: in a
sandboxed Jinja environment (the template comes from a file, so it must not reach Python),
blocks trimmed, with ``messages``, ``add_generation_prompt``, the special tokens and
``raise_exception`` in scope.

    render_chat(template, [{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    # '<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'  (a ChatML template)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from glassformer.errors import MissingDependencyError

ROLES = ("system", "user", "assistant")


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, str]],
    *,
    add_generation_prompt: bool = True,
    special_tokens: Mapping[str, str] | None = None,
) -> str:
    """The text of ``messages`` formatted by ``template``.

    Args:
        template: the Jinja chat template.
        messages: ``{"role": "system" | "user" | "assistant", "content": str}`` each.
        add_generation_prompt: end with the opening of an assistant turn, so that what the
            model writes next is the reply.
        special_tokens: names the template may use (``bos_token``, ``eos_token``, ...).

    Raises:
        ValueError: a message that is not a role and a string content, or a template that
            does not render (its own ``raise_exception`` included), with the reason.
    """
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or m.get("role") not in ROLES:
            raise ValueError(f"message {i} must have a role in {ROLES}, got {m!r}")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} must have a string content, got {m.get('content')!r}")
    jinja2 = _require_jinja2()
    try:
        compiled = _compile(template)
        return compiled.render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            **dict(special_tokens or {}),
        )
    except jinja2.TemplateError as e:
        raise ValueError(f"the chat template does not render: {e}") from None


@lru_cache(maxsize=8)
def _compile(template: str) -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    return env.from_string(template)


def _raise(message: str) -> None:
    import jinja2

    raise jinja2.TemplateError(message)


def _require_jinja2() -> Any:
    try:
        import jinja2
    except ImportError:
        raise MissingDependencyError(
            "chat templates are rendered with Jinja: pip install jinja2"
        ) from None
    return jinja2
