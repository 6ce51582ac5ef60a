"""Reading the Headers column: the poison rule (what is not a flat JSON object of strings)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import orjson

__all__ = ["decode_headers", "decode_header_texts"]


def decode_headers(text: str | None) -> dict[str, str | None] | None:
    """Parse the Headers column; None when it is poison: not a flat JSON object of strings (or
    nulls). ``''`` is no headers (``{}``), as NServiceBus reads it (`Message`:
    ``string.IsNullOrEmpty``); white space alone is not JSON, so None. An escaped lone UTF-16
    surrogate (``\\ud800`` alone) is poison too: NServiceBus's System.Text.Json cannot read it
    as a string, and PostgreSQL's jsonb refuses it.

    This is the rule that decides which claimed messages are poison (`decode_header_texts`), and
    the one other paths (peek, the CLI, tests) read headers by.
    """
    if text is None:
        return None
    if text == "":
        return {}
    try:
        value = orjson.loads(text)
    except (TypeError, ValueError):
        # orjson refuses lone surrogates and numbers beyond a double (1e999): the standard
        # library decides, told to refuse what jsonb refuses: a lone surrogate anywhere in the
        # text (even in a value a repeated key then replaces), NaN and Infinity
        if _lone_surrogate(text):
            return None
        try:
            value = json.loads(text, parse_constant=_no_constant)
        except (ValueError, RecursionError):
            return None
    return value if _flat(value) else None


def decode_header_texts(texts: Sequence[str]) -> list[dict[str, str | None] | None]:
    """`decode_headers` of many texts: orjson for each, the exact rule only for what it refuses."""
    loads = orjson.loads
    out: list[dict[str, str | None] | None] = []
    for text in texts:
        try:
            value = loads(text)
        except (TypeError, ValueError):
            out.append(decode_headers(text))
            continue
        out.append(value if _flat(value) else None)
    return out


def _flat(value: Any) -> bool:
    """A JSON value is a header set: an object whose values are strings or null."""
    return type(value) is dict and all(v is None or type(v) is str for v in value.values())


_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)


def _lone_surrogate(text: str) -> bool:
    """Does the text hold a \\u escape of half a UTF-16 surrogate pair without its other half?"""
    high_end = -1  # where the escape of a high surrogate waiting for its low half ends
    for m in _ESCAPE.finditer(text):
        unit = int(m.group(1), 16) if m.group(1) else None
        if high_end >= 0:
            if m.start() == high_end and unit is not None and 0xDC00 <= unit <= 0xDFFF:
                high_end = -1
                continue
            return True
        if unit is not None and 0xD800 <= unit <= 0xDBFF:
            high_end = m.end()
        elif unit is not None and 0xDC00 <= unit <= 0xDFFF:
            return True
    return high_end >= 0


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
