"""One self-contained page: the package's ``html/`` files put together, offline.

``render`` fills ``html/page.html`` with a body, its styles, its scripts and its data, under a
Content-Security-Policy that allows no network and no script or style but the page's own
(by their hashes). The data is JSON inside ``<script type="application/json">``, escaped by
``embed_json`` so that no text in it ends the element; text that is only read, never shown
(a live page's weights), may go in inert ``<template>`` blocks. Every viewer, the explorable
forward pass, the live page, the graph and the circuit page are made here.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from importlib import resources
from typing import Any


def embed_json(data: Any) -> str:
    """``data`` as JSON safe inside a ``<script>`` element: ``<``, ``>`` and ``&`` escaped
    as ``\\u003c`` and so on, so no text in it (``</script>``, ``<!--``) can end the element."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(char, escape)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def render(
    body_name: str,
    styles: tuple[str, ...],
    script_names: tuple[str, ...],
    data: dict[str, Any],
    *,
    title: str,
    data_id: str,
    inert: dict[str, str] | None = None,
) -> str:
    """A page of the package's ``html/`` files: ``page.html`` (the head, the header) with the
    body, the styles, the data (JSON in the element ``data_id``, see ``embed_json``) and the
    scripts put in, under a policy that allows no network and no script or style but these.
    ``inert`` (id → text without ``<`` or ``&``) is put in ``<template>`` elements: megabytes of
    text the browser's parser reads in half the time it takes inside a script element."""
    template = _asset("page.html").replace("{{body}}", _asset(body_name))
    style = "\n".join(_asset(name) for name in styles)
    scripts = [_asset(name) for name in script_names]
    hashes = " ".join(f"'{_sha256(script)}'" for script in scripts)
    policy = (
        f"default-src 'none'; script-src {hashes}; style-src '{_sha256(style)}'; "
        "img-src data: blob:"
    )
    parts = {
        "policy": policy,
        "style": style,
        "title": html.escape(title),
        "data_id": data_id,
        "data": embed_json(data),
        "scripts": "\n".join(f"<script>{script}</script>" for script in scripts),
        "inert": "".join(
            f'<template id="{key}">{_inert(text)}</template>\n'
            for key, text in (inert or {}).items()
        ),
    }
    # one pass: a placeholder inside the data or the script is never replaced in turn
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], template)


def _inert(text: str) -> str:
    if "<" in text or "&" in text:
        raise ValueError("an inert block's text must hold no '<' or '&' (it would be markup)")
    return text


def _asset(name: str) -> str:
    return (resources.files("glassformer.viz") / "html" / name).read_text(encoding="utf-8")


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode()
