"""Headers judged on the driver: the rows a statement returns as (queue sequence, headers text), a
page at a time, each judged by the rule every read judges by (`wire.decode_header_texts`), so the
database parses no header. Used where the driver must know a claim's poison before the claim ends:
a numbered claim's pick (`claimer.pick`), a prepared claim taken in one pass (`Claimer._take`) and
the parking of a prepared claim (`prepared.park`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ...dialects import Cursor, Statement
from ...wire import decode_header_texts
from .. import session as db

__all__ = ["FIRST_PAGE", "PAGE_BYTES", "PAGE_ROWS", "judged"]

#: rows the first page asks for; later pages are sized by the largest headers seen
FIRST_PAGE = 256
#: most rows a page asks for, and the bytes of headers it aims at
PAGE_ROWS, PAGE_BYTES = 10_000, 16 * 2**20


def judged(cur: Cursor, page: Callable[[int, int], list[Statement]], *, after: int,
           limit: int | None = None) -> Iterator[tuple[tuple[Any, ...], dict[str, str | None] | None]]:
    """(row, its headers or None when poison) of the rows `page(after, n)` returns, its LAST
    statement giving rows (seq, headers text, ...), each page after the highest seq of the one
    before, until a page comes short or `limit` rows were given. A page's headers are bounded
    in bytes, so a claim of many rows never holds them all."""
    size, largest, given = FIRST_PAGE if limit is None else min(limit, FIRST_PAGE), 1, 0
    while limit is None or given < limit:
        ask = size if limit is None else min(size, limit - given)
        rows = db.rows(cur, db.prefixed(cur, page(after, ask)))
        texts = [str(row[1]) for row in rows]
        for row, headers in zip(rows, decode_header_texts(texts), strict=True):
            yield tuple(row), headers
        given += len(rows)
        if len(rows) < ask:
            return
        after = max(int(row[0]) for row in rows)  # a DELETE ... RETURNING gives its rows in no order
        largest = max(largest, *(len(t) for t in texts))
        size = max(1, min(PAGE_ROWS, size * 4, PAGE_BYTES // largest))
