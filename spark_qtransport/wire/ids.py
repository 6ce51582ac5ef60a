"""Random version-4 UUIDs in bulk: message ids and conversation ids for a task's messages."""

from __future__ import annotations

import os
from collections.abc import Iterator

__all__ = ["uuid4s", "uuid4_list", "uuid4_texts"]


#: byte -> the byte with a version-4 UUID's version nibble (byte 6), and its variant bits (byte 8)
_VERSION_4 = bytes((b & 0x0F) | 0x40 for b in range(256))
_VARIANT = bytes((b & 0x3F) | 0x80 for b in range(256))


def uuid4s(n: int) -> Iterator[bytes]:
    """`n` random version-4 UUIDs as 16 bytes each: the bits of ``uuid.uuid4()`` (`os.urandom`)
    from one read, without a `uuid.UUID` object each."""
    raw = bytearray(os.urandom(16 * n))
    raw[6::16] = raw[6::16].translate(_VERSION_4)
    raw[8::16] = raw[8::16].translate(_VARIANT)
    ids = bytes(raw)
    return (ids[i:i + 16] for i in range(0, 16 * n, 16))


#: where the 32 hex digits of a UUID's text go in its 36 characters (the rest are dashes)
_HEX_AT = [p for p in range(36) if p not in (8, 13, 18, 23)]


def uuid4_list(n: int) -> list[str]:
    """`n` values of ``str(uuid.uuid4())`` (the bits of `uuid4s`: one `os.urandom` read), made
    with a few operations over all of them rather than some per id: each hex digit's column is
    copied into its place in one text of ``n`` lines, which is split once."""
    if n <= 0:
        return []
    raw = bytearray(os.urandom(16 * n))
    raw[6::16] = raw[6::16].translate(_VERSION_4)
    raw[8::16] = raw[8::16].translate(_VARIANT)
    digits = raw.hex().encode("ascii")
    out = bytearray(b"-" * (37 * n))
    out[36::37] = b"\n" * n
    for j, p in enumerate(_HEX_AT):
        out[p::37] = digits[j::32]
    del out[-1]
    return out.decode("ascii").split("\n")


def uuid4_texts() -> Iterator[str]:
    """``str(uuid.uuid4())`` values without end, 256 from each `uuid4_list`. Make one per task in
    the task's own process (never shared by forked workers)."""
    while True:
        yield from uuid4_list(256)
