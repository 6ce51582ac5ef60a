"""Writing the Headers column as NServiceBus does: a flat JSON object, ``/`` escaped as ``\\/``,
non-ASCII as it is. orjson writes the object (what ``json.dumps(..., ensure_ascii=False)`` writes,
tests hold them equal); the standard library where orjson refuses (a lone surrogate)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence

import orjson

__all__ = ["encode_headers"]


def encode_headers(headers: Mapping[str, str | None]) -> str:
    """Serialize headers as NServiceBus does: a flat object, ``/`` escaped as ``\\/``, non-ASCII raw."""
    return _encode_text(dict(headers)).replace("/", "\\/")


def _dumps(headers: Mapping[str, str | None]) -> str:
    return json.dumps(headers, ensure_ascii=False, separators=(",", ":"))


def _encode_text(headers: Mapping[str, str | None]) -> str:
    """The headers' JSON text (``/`` not escaped yet): orjson's, or the standard library's for what
    orjson refuses (a lone surrogate, a key that is not text), which then writes or refuses it."""
    try:
        return orjson.dumps(headers).decode()
    except TypeError:
        return _dumps(headers)


_encode_string: Callable[[str], str] = json.encoder.encode_basestring  # what json.dumps(ensure_ascii=False) uses


def _escaped(value: str) -> str:
    """`value` as a headers text holds it: a JSON string (`encode_headers`), ``/`` as ``\\/``."""
    return _encode_string(value).replace("/", "\\/")


def _inner_all(values: Sequence[str]) -> Sequence[str]:
    """`_escaped` of each value without its quotes: `values` themselves when none has a
    character to escape (ids usually: the usual case costs one pass over their joined text)."""
    joined = "".join(values)
    if "/" not in joined and len(_encode_string(joined)) == len(joined) + 2:  # escaping adds characters
        return values
    return [_escaped(v)[1:-1] for v in values]
