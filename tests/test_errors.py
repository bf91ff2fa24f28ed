"""``shown`` and ``one_line``: how every reader puts a file's value, or a library's message
about it, into its one-line refusal (issue 49: values of 100 KB were echoed whole)."""

from __future__ import annotations

import pytest

from glassformer.errors import one_line, shown


@pytest.mark.parametrize(
    "value, expected",
    [("silu", "'silu'"), (12, "12"), (None, "None"), ([1, "a"], "[1, 'a']"), (float("inf"), "inf")],
)
def test_a_short_value_is_its_repr(value, expected):
    assert shown(value) == expected


@pytest.mark.parametrize(
    "value, length",
    [
        ("x" * 100_000, "(100,000 characters)"),
        (b"\0" * 5_000, "(5,000 bytes)"),
        (["x" * 100_000], "(100,004 characters)"),  # a list: the length of its repr
        (10**4000, "(4,001 characters)"),
        ("a\nb" * 50_000, "(150,000 characters)"),
    ],
    ids=["str", "bytes", "list", "int", "newlines"],
)
def test_a_long_value_is_cut_in_the_middle_with_its_length(value, length):
    text = shown(value)
    assert "\n" not in text and len(text) <= 80 + len(length) + 1 and text.endswith(length)
    head, tail = text[: -len(length) - 1].split("…")
    assert repr(value).startswith(head) and repr(value).endswith(tail)


def test_a_value_python_cannot_write_is_named_by_its_type():
    """str() of an int past 4,300 digits raises ValueError; a list nested 100,000 deep
    raises RecursionError: neither may escape from the message that shows them."""
    nested: list = []
    for _ in range(100_000):
        nested = [nested]
    assert shown(10**5000) == "a value of type int too large to show"
    assert shown(nested) == "a value of type list too large to show"


def test_one_line_joins_lines_and_cuts_a_long_message():
    assert one_line(RuntimeError("Missing key(s):\n  a,\n  b")) == "Missing key(s): a, b"
    text = one_line(ValueError("unknown variant `" + "x" * 100_000 + "`, expected F32"), 300)
    assert len(text) < 330 and text.startswith("unknown variant `xxx")
    assert text.endswith("`, expected F32 (100,032 characters)")
